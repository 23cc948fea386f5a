"""Goal: RabbitMQ's vhost limits (max-connections, max-queues) and user
limits (max-connections, max-channels), set through the management API
(RabbitMQ's /api/vhost-limits and /api/user-limits) and in a cluster
agreed through the cluster map, are enforced with RabbitMQ 3.10's codes and
words: a connection beyond a vhost's or user's max-connections is refused
at connection.open (530 NOT_ALLOWED), a channel.open beyond a user's
max-channels fails the connection (530), a queue.declare of a new queue
beyond the vhost's max-queues closes the channel (406 PRECONDITION_FAILED);
raising or clearing a limit lets clients in again, a negative value means
no limit and 0 none allowed; limits survive a restart; a bad body is 400,
an unknown vhost or user 404, and a user without the administrator tag
may not set them (RabbitMQ's 401 not_authorised).

Method: one quayd with --http (QUAY_TEST_MODE=single) or the 3-broker test
cluster (cluster): limits are set through broker "a"'s API and enforced on
broker "b", the test client's broker, which places queues on the others.
Refusals are read with the harness's own frame codec (exact codes and
texts), the rest with pika. Connection and channel counts are every
broker's (each tells the others its counts of limited names:
broker/usage.h; limits_count_every_broker opens them on a, b and c, and
kills c), the queue count is
the vhost's queues in the cluster map (which refuses a declare beyond it
when it applies it: test_cluster_map's test_limits). The refusals (codes, texts, class
and method ids) were compared with RabbitMQ 3.10.8 run by hand
(shared/bench/run-rabbitmq.sh, limits set with rabbitmqctl): its user
connection refusal starts with a lower-case "connection refused".
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F403

QUAYD = os.environ.get("QUAYD", "")


def nodes():
    """(A, B): where limits are set, where clients connect (quaytest's Node,
    its connections closed after each test; the one broker twice when
    single)."""
    return broker_node("a", tracked=True), broker_node(CLUSTER_CLIENT, tracked=True)


def ok(status_body, expected, what):
    status, body = status_body
    if isinstance(expected, tuple):
        assert status in expected, "%s: %d (%r)" % (what, status, body)
    else:
        eq(status, expected, "%s (%r)" % (what, body))
    return body


def path(s):
    return s.replace("/", "%2F")


def set_vhost_limit(node, vhost, name, value):
    ok(node.api("PUT", "/api/vhost-limits/%s/%s" % (path(vhost), name), {"value": value}),
       204, "vhost limit %s %s" % (vhost, name))


def set_user_limit(node, user, name, value):
    ok(node.api("PUT", "/api/user-limits/%s/%s" % (user, name), {"value": value}),
       204, "user limit %s %s" % (user, name))


def vhost_limits_on(node, vhost):
    return ok(node.api("GET", "/api/vhost-limits/" + path(vhost)), 200, "GET limits")


def wait_vhost_limits(node, vhost, value):
    """In a cluster b applies what a committed a moment later."""
    want = [{"vhost": vhost, "value": value}] if value else []
    wait_until(lambda: vhost_limits_on(node, vhost) == want, timeout=10,
               what="limits of %s on %s" % (vhost, node.name))


def wait_user_limits(node, user, value):
    want = [{"user": user, "value": value}] if value else []
    wait_until(lambda: ok(node.api("GET", "/api/user-limits/" + user), 200, "GET") == want,
               timeout=10, what="limits of %s on %s" % (user, node.name))


def open_refused(node, vhost="/", user="guest", password="guest"):
    """connection.open is answered with connection.close: (code, text,
    class, method)."""
    s = node.sock()
    s.sendall(PROTOCOL_HEADER)
    expect_method(s, *CONNECTION_START)
    s.sendall(gen_connection_start_ok(user, password, "PLAIN"))
    m = expect_method(s, *CONNECTION_TUNE)
    channel_max, frame_max, _ = m.args.short(), m.args.long(), m.args.short()
    s.sendall(gen_tune_ok(channel_max, frame_max, 0))
    s.sendall(gen_open(vhost))
    m = read_method(s)
    if m.id != CONNECTION_CLOSE:
        s.close()  # let in: it must not take a place the next try counts
        raise AssertionError("connection.open answered with %r" % m)
    close = decode_close(m)
    s.sendall(gen_connection_close_ok())
    return close


def expect_open_refused(node, code, text, **kw):
    """As open_refused, waiting for a limit a just set to reach b."""
    got = [None]

    def refused():
        try:
            got[0] = open_refused(node, **kw)
            return True
        except AssertionError:
            return False
    wait_until(refused, timeout=10, what="refusal on %s" % node.name)
    eq(got[0], (code, text, 10, 40))  # connection.open


def setup_vhost(a, b, vhost):
    a.api("DELETE", "/api/vhosts/" + path(vhost))
    ok(a.api("PUT", "/api/vhosts/" + path(vhost)), 201, "vhost " + vhost)
    ok(a.api("PUT", "/api/permissions/%s/guest" % path(vhost),
             {"configure": ".*", "write": ".*", "read": ".*"}), (201, 204), "permission")
    wait_until(lambda: b.api("GET", "/api/vhosts/" + path(vhost))[0] == 200, timeout=10,
               what="vhost on b")
    wait_until(lambda: b.api("GET", "/api/permissions/%s/guest" % path(vhost))[0] == 200,
               timeout=10, what="permission on b")


def setup_user(a, b, user, password="pw"):
    ok(a.api("PUT", "/api/users/" + user, {"password": password, "tags": ""}), (201, 204), user)
    ok(a.api("PUT", "/api/permissions/%2F/" + user,
             {"configure": ".*", "write": ".*", "read": ".*"}), (201, 204), "permission")
    wait_until(lambda: b.api("GET", "/api/permissions/%2F/" + user)[0] == 200, timeout=10,
               what="user on b")


@test(timeout=90)
def vhost_max_connections():
    a, b = nodes()
    setup_vhost(a, b, "v-conn")
    set_vhost_limit(a, "v-conn", "max-connections", 2)
    wait_vhost_limits(b, "v-conn", {"max-connections": 2})
    eq([x for x in ok(a.api("GET", "/api/vhost-limits"), 200, "list")
        if x["vhost"] == "v-conn"], [{"vhost": "v-conn", "value": {"max-connections": 2}}])
    c1 = b.connect(vhost="v-conn")
    c2 = b.connect(vhost="v-conn")
    expect_open_refused(b, 530, "NOT_ALLOWED - access to vhost 'v-conn' refused for user "
                        "'guest': connection limit (2) is reached", vhost="v-conn")
    b.connect().close()  # other vhosts are not limited
    c1.close()
    c3 = b.connect(vhost="v-conn")  # a closed connection frees its place
    set_vhost_limit(a, "v-conn", "max-connections", 3)
    wait_vhost_limits(b, "v-conn", {"max-connections": 3})
    c4 = b.connect(vhost="v-conn")
    set_vhost_limit(a, "v-conn", "max-connections", 0)  # none allowed
    expect_open_refused(b, 530, "NOT_ALLOWED - access to vhost 'v-conn' refused for user "
                        "'guest': connection limit (0) is reached", vhost="v-conn")
    set_vhost_limit(a, "v-conn", "max-connections", -1)  # no limit, kept and shown
    wait_vhost_limits(b, "v-conn", {"max-connections": -1})
    c5 = b.connect(vhost="v-conn")
    ok(a.api("DELETE", "/api/vhost-limits/v-conn/max-connections"), 204, "clear")
    wait_vhost_limits(b, "v-conn", None)
    for c in (c2, c3, c4, c5):
        c.close()


@test(timeout=90)
def vhost_max_queues():
    a, b = nodes()
    setup_vhost(a, b, "v-queues")
    set_vhost_limit(a, "v-queues", "max-queues", 2)
    wait_vhost_limits(b, "v-queues", {"max-queues": 2})
    c = b.connect(vhost="v-queues")
    ch = c.channel()
    ch.queue_declare("q1")
    ch.queue_declare("q2")
    ch.queue_declare("q1")  # a redeclare is no new queue
    ch.queue_declare("q2", passive=True)
    text = expect_channel_error(406, ch.queue_declare, "q3")
    eq(text, "PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost "
       "'v-queues' (2) is reached")
    ch = c.channel()
    ch.queue_delete("q2")
    ch.queue_declare("q3")  # a deleted queue frees its place
    expect_channel_error(406, ch.queue_declare, "q4")
    set_vhost_limit(a, "v-queues", "max-queues", -5)
    wait_vhost_limits(b, "v-queues", {"max-queues": -5})
    ch = c.channel()
    ch.queue_declare("q4")
    ch.queue_declare("q5")
    ok(a.api("DELETE", "/api/vhost-limits/v-queues/max-queues"), 204, "clear")
    c.close()


@test(timeout=90)
def user_max_connections():
    a, b = nodes()
    setup_user(a, b, "lim-conn")
    set_user_limit(a, "lim-conn", "max-connections", 1)
    wait_user_limits(b, "lim-conn", {"max-connections": 1})
    c1 = b.connect("lim-conn", "pw")
    expect_open_refused(b, 530, "NOT_ALLOWED - connection refused for user 'lim-conn': user "
                        "connection limit (1) is reached", user="lim-conn", password="pw")
    b.connect().close()  # guest is not limited
    ok(a.api("DELETE", "/api/user-limits/lim-conn/max-connections"), 204, "clear")
    wait_user_limits(b, "lim-conn", None)
    c2 = b.connect("lim-conn", "pw")
    c1.close()
    c2.close()


@test(timeout=90)
def user_max_channels():
    a, b = nodes()
    setup_user(a, b, "lim-chan")
    set_user_limit(a, "lim-chan", "max-channels", 2)
    wait_user_limits(b, "lim-chan", {"max-channels": 2})
    c1 = b.connect("lim-chan", "pw")
    c1.channel()
    c2 = b.connect("lim-chan", "pw")
    c2.channel()  # the user's channels over its connections
    text = expect_connection_error(530, c2.channel)
    eq(text, "NOT_ALLOWED - number of channels opened for user 'lim-chan' has reached the "
       "maximum allowed user limit of (2)")
    c1.channel()  # c2's channel went with it: room for one more
    expect_connection_error(530, c1.channel)
    set_user_limit(a, "lim-chan", "max-channels", 3)
    wait_user_limits(b, "lim-chan", {"max-channels": 3})
    c3 = b.connect("lim-chan", "pw")
    c3.channel()
    c3.channel()
    c3.close()
    set_user_limit(a, "lim-chan", "max-connections", 5)
    wait_user_limits(b, "lim-chan", {"max-connections": 5, "max-channels": 3})
    eq([x for x in ok(a.api("GET", "/api/user-limits"), 200, "list")
        if x["user"] == "lim-chan"],
       [{"user": "lim-chan", "value": {"max-connections": 5, "max-channels": 3}}])
    ok(a.api("DELETE", "/api/users/lim-chan"), 204, "user deleted")
    wait_until(lambda: b.api("GET", "/api/user-limits/lim-chan")[0] == 404, timeout=10,
               what="the user's limits gone with it")
    eq([x for x in ok(b.api("GET", "/api/user-limits"), 200, "list")
        if x["user"] == "lim-chan"], [])


def third():
    """The broker neither a (where limits are set) nor b (the client's);
    the one broker when single."""
    return broker_node("c", tracked=True)


def channel_refused(node, user, password, text):
    """A new connection's channel.open on node fails it with 530 and text;
    False (and the connection closed) if it was let in: a count another
    broker sent may still be on its way."""
    import pika.exceptions as pe
    c = node.connect(user, password)
    try:
        c.channel()
    except pe.ConnectionClosedByBroker as e:
        eq((e.reply_code, e.reply_text), (530, text))
        return True
    c.close()
    return False


@test(timeout=150)
def limits_count_every_broker():
    """Connections and channels on every broker count toward a limit (as
    RabbitMQ counts them cluster-wide), and stop counting when they close
    or their broker dies."""
    a, b = nodes()
    c = third()
    setup_user(a, b, "lim-wide")
    setup_user(a, c, "lim-wide")
    set_user_limit(a, "lim-wide", "max-connections", 2)
    for n in (b, c):
        wait_user_limits(n, "lim-wide", {"max-connections": 2})
    refused = ("NOT_ALLOWED - connection refused for user 'lim-wide': user connection limit "
               "(2) is reached")
    on_a = a.connect("lim-wide", "pw")
    on_c = c.connect("lim-wide", "pw")
    expect_open_refused(b, 530, refused, user="lim-wide", password="pw")
    on_a.close()  # its place is free on every broker
    wait_until(lambda: _opens(b, "lim-wide", "pw"), timeout=10, what="a's place freed on b")
    on_b = b.connect("lim-wide", "pw")
    expect_open_refused(a, 530, refused, user="lim-wide", password="pw")
    on_b.close()

    setup_vhost(a, b, "v-wide")
    setup_vhost(a, c, "v-wide")
    set_vhost_limit(a, "v-wide", "max-connections", 1)
    for n in (b, c):
        wait_vhost_limits(n, "v-wide", {"max-connections": 1})
    in_vhost = c.connect(vhost="v-wide")
    expect_open_refused(b, 530, "NOT_ALLOWED - access to vhost 'v-wide' refused for user "
                        "'guest': connection limit (1) is reached", vhost="v-wide")
    in_vhost.close()

    set_user_limit(a, "lim-wide", "max-connections", 10)
    set_user_limit(a, "lim-wide", "max-channels", 3)
    for n in (b, c):
        wait_user_limits(n, "lim-wide", {"max-connections": 10, "max-channels": 3})
    on_c.channel()
    on_c.channel()
    on_b = b.connect("lim-wide", "pw")
    on_b.channel()  # the third: c's two and this one
    full = ("NOT_ALLOWED - number of channels opened for user 'lim-wide' has reached the "
            "maximum allowed user limit of (3)")
    wait_until(lambda: channel_refused(a, "lim-wide", "pw", full), timeout=10,
               what="a fourth channel refused on a")
    if not CLUSTERED:
        return
    # A broker that dies takes its clients' counts with it: c's two
    # channels and its connection stop counting once its link is gone.
    broker().member("c").kill()
    wait_until(lambda: not channel_refused(b, "lim-wide", "pw", full), timeout=20,
               what="c's channels forgotten on b")
    member = broker().member("c")
    member.start()
    wait_until(lambda: port_accepts(c.amqp_port), timeout=30, what="c back")
    on_b.close()


def _opens(node, user, password):
    try:
        node.connect(user, password).close()
        return True
    except Exception:  # noqa: BLE001  (refused: not yet)
        return False


@test(timeout=60)
def bad_requests():
    a, _ = nodes()
    setup_vhost(a, a, "v-bad")
    for body in ({"value": "ten"}, {}, {"value": 1, "other": 2}, {"value": 1.5},
                 {"value": 1 << 40}):
        status, _ = a.api("PUT", "/api/vhost-limits/v-bad/max-connections", body)
        eq(status, 400, "body %r" % (body,))
    eq(a.api("PUT", "/api/vhost-limits/v-bad/max-channels", {"value": 1})[0], 400,
       "a user's limit on a vhost")
    eq(a.api("PUT", "/api/user-limits/guest/max-queues", {"value": 1})[0], 400,
       "a vhost's limit on a user")
    eq(a.api("PUT", "/api/vhost-limits/no-such/max-queues", {"value": 1})[0], 404, "vhost")
    eq(a.api("GET", "/api/vhost-limits/no-such")[0], 404, "GET unknown vhost")
    eq(a.api("PUT", "/api/user-limits/no-such/max-channels", {"value": 1})[0], 404, "user")
    eq(vhost_limits_on(a, "v-bad"), [])
    # A user without the administrator tag may not set limits.
    ok(a.api("PUT", "/api/users/lim-mgmt", {"password": "pw", "tags": "management,policymaker"}),
       201, "lim-mgmt")
    status, body = a.api("PUT", "/api/vhost-limits/v-bad/max-queues", {"value": 1},
                         user="lim-mgmt", password="pw")
    eq((status, body), (401, {"error": "not_authorised", "reason": "Not administrator user"}))
    status, _ = a.api("PUT", "/api/user-limits/guest/max-channels", {"value": 1},
                      user="lim-mgmt", password="pw")
    eq(status, 401)
    eq(vhost_limits_on(a, "v-bad"), [])
    # Reading a vhost's limits needs management and the vhost (RabbitMQ).
    mgmt = {"user": "lim-mgmt", "password": "pw"}
    eq(a.api("GET", "/api/vhost-limits/v-bad", **mgmt),
       (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"}))
    eq(a.api("GET", "/api/user-limits", **mgmt)[0], 401)
    ok(a.api("PUT", "/api/permissions/v-bad/lim-mgmt",
             {"configure": "", "write": "", "read": ""}), 201, "lim-mgmt on v-bad")
    set_vhost_limit(a, "v-bad", "max-queues", 9)
    eq(a.api("GET", "/api/vhost-limits/v-bad", **mgmt),
       (200, [{"vhost": "v-bad", "value": {"max-queues": 9}}]))
    eq(a.api("GET", "/api/vhost-limits", **mgmt),
       (200, [{"vhost": "v-bad", "value": {"max-queues": 9}}]))
    eq(a.api("DELETE", "/api/vhost-limits/v-bad/max-queues", **mgmt)[0], 401)
    ok(a.api("DELETE", "/api/vhost-limits/v-bad/max-queues"), 204, "clear")
    # Deleting a vhost deletes its limits.
    set_vhost_limit(a, "v-bad", "max-queues", 7)
    ok(a.api("DELETE", "/api/vhosts/v-bad"), 204, "vhost deleted")
    ok(a.api("PUT", "/api/vhosts/v-bad"), 201, "vhost again")
    eq(vhost_limits_on(a, "v-bad"), [])


@test(timeout=60)
def quayctl_manages_limits():
    a, b = nodes()
    quayctl = os.path.join(os.path.dirname(QUAYD), "quayctl")
    ctl = [quayctl, "--http", "127.0.0.1:%d" % a.http_port]

    def run_ctl(*args, rc=0):
        out = subprocess.run(ctl + list(args), capture_output=True, text=True, timeout=30)
        eq(out.returncode, rc, "quayctl %s: %s" % (" ".join(args), out.stderr))
        return out.stdout

    def rows(text):
        return [line.split() for line in text.splitlines()[1:]]
    setup_vhost(a, b, "v-ctl")
    setup_user(a, b, "lim-ctl")
    run_ctl("set-vhost-limits", "-p", "v-ctl", '{"max-connections": 4, "max-queues": 7}')
    eq(rows(run_ctl("list-vhost-limits", "-p", "v-ctl")),
       [["v-ctl", "max-connections=4,max-queues=7"]])
    assert ["v-ctl", "max-connections=4,max-queues=7"] in rows(run_ctl("list-vhost-limits"))
    run_ctl("set-user-limits", "lim-ctl", '{"max-channels": 2}')
    assert ["lim-ctl", "max-channels=2"] in rows(run_ctl("list-user-limits"))
    run_ctl("set-vhost-limits", "-p", "v-ctl", "max-queues=7", rc=64)
    run_ctl("set-vhost-limits", "-p", "v-ctl", '{"max-queues": "7"}', rc=64)
    run_ctl("set-vhost-limits", "-p", "v-ctl", '{"max-channels": 7}', rc=76)
    run_ctl("set-vhost-limits", "-p", "no-such", '{"max-queues": 7}', rc=76)
    wait_vhost_limits(b, "v-ctl", {"max-connections": 4, "max-queues": 7})
    run_ctl("clear-vhost-limits", "-p", "v-ctl")
    run_ctl("clear-user-limits", "lim-ctl", "max-channels")
    eq(rows(run_ctl("list-vhost-limits", "-p", "v-ctl")), [])
    assert not any(r[0] == "lim-ctl" for r in rows(run_ctl("list-user-limits")))
    run_ctl("set-user-limits", "lim-ctl", '{"max-channels": 2, "max-connections": 1}')
    run_ctl("clear-user-limits", "lim-ctl", "all")
    assert not any(r[0] == "lim-ctl" for r in rows(run_ctl("list-user-limits")))


@test(timeout=60)
def definitions_carry_limits():
    """RabbitMQ 3.10's format: vhost limits are "parameters" of component
    vhost-limits named "limits", a user's are its "limits" object. An import
    sets them as /api/vhost-limits does: the item's become the vhost's."""
    a, b = nodes()
    setup_vhost(a, b, "v-defs")
    setup_user(a, b, "lim-defs")
    set_vhost_limit(a, "v-defs", "max-queues", 3)
    set_vhost_limit(a, "v-defs", "max-connections", -1)
    set_user_limit(a, "lim-defs", "max-channels", 4)
    defs = ok(a.api("GET", "/api/definitions"), 200, "export")
    eq([p for p in defs["parameters"] if p.get("vhost") == "v-defs"],
       [{"value": {"max-connections": -1, "max-queues": 3}, "vhost": "v-defs",
         "component": "vhost-limits", "name": "limits"}])
    eq(next(u for u in defs["users"] if u["name"] == "lim-defs")["limits"], {"max-channels": 4})
    eq(next(u for u in defs["users"] if u["name"] == "guest")["limits"], {})
    one = ok(a.api("GET", "/api/definitions/v-defs"), 200, "export of a vhost")
    eq(one["parameters"], [{"value": {"max-connections": -1, "max-queues": 3},
                            "component": "vhost-limits", "name": "limits"}])
    ok(a.api("POST", "/api/definitions", defs), 204, "import of the export")
    changed = dict(defs, parameters=[{"value": {"max-queues": 4}, "vhost": "v-defs",
                                      "component": "vhost-limits", "name": "limits"}])
    ok(a.api("POST", "/api/definitions", changed), 204, "import of other limits")
    for n in (a, b):
        wait_vhost_limits(n, "v-defs", {"max-queues": 4})
    other = dict(defs, parameters=[{"value": {}, "vhost": "v-defs", "component": "federation",
                                    "name": "x"}])
    eq(a.api("POST", "/api/definitions", other)[0], 400, "another component")


def restart_single():
    own = Restartable(http=True)  # (quaytest's)
    n = own.node(tracked=True)
    own.start()
    try:
        setup_vhost(n, n, "v-kept")
        setup_user(n, n, "kept")
        set_vhost_limit(n, "v-kept", "max-connections", 1)
        set_vhost_limit(n, "v-kept", "max-queues", 4)
        set_user_limit(n, "kept", "max-channels", 3)
        set_user_limit(n, "kept", "max-connections", 9)
        ok(n.api("DELETE", "/api/user-limits/kept/max-connections"), 204, "cleared")
    finally:
        own.stop()
    own.start()
    try:
        eq(vhost_limits_on(n, "v-kept"),
           [{"vhost": "v-kept", "value": {"max-connections": 1, "max-queues": 4}}])
        wait_user_limits(n, "kept", {"max-channels": 3})
        c = n.connect(vhost="v-kept")
        eq(open_refused(n, vhost="v-kept"),
           (530, "NOT_ALLOWED - access to vhost 'v-kept' refused for user 'guest': "
            "connection limit (1) is reached", 10, 40))
        c.close()
    finally:
        own.stop()


@test(timeout=150)
def limits_survive_a_restart():
    if not CLUSTERED:
        restart_single()
        return
    a, b = nodes()
    setup_vhost(a, b, "v-kept")
    set_vhost_limit(a, "v-kept", "max-queues", 4)
    set_user_limit(a, "guest", "max-channels", 100)
    member = broker().member("a")
    member.restart()
    wait_until(lambda: port_accepts(a.http_port), timeout=30, what="a back")
    wait_until(lambda: a.api("GET", "/api/vhost-limits/v-kept") ==
               (200, [{"vhost": "v-kept", "value": {"max-queues": 4}}]),
               timeout=30, what="limits on the restarted broker")
    wait_user_limits(a, "guest", {"max-channels": 100})
    ok(b.api("DELETE", "/api/user-limits/guest/max-channels"), 204, "clear")
    wait_user_limits(a, "guest", None)


if __name__ == "__main__":
    quaytest._broker = Broker(external_ok=False, http=True)
    run()
