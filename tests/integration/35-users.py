"""Goal: users, vhosts and permissions are managed while the broker runs,
through RabbitMQ's management API paths and quayctl, durably, and (in a
cluster) agreed by every broker through the cluster map: a change made
through one broker's API holds for logins and operations on another; a
permission change refuses the next operation of a connection already open
(403 ACCESS_REFUSED); deleting a user closes its connections on every broker
(320 CONNECTION_FORCED "user 'x' is deleted"); deleting a vhost deletes its
queues everywhere and closes its connections; users survive a restart, and
the users file only seeds the first start; bad input (malformed JSON, an
unknown hashing algorithm or a hash not of the one named, a bad regex, no tags) is refused with RabbitMQ's
400 and changes nothing.

Method: one quayd with --http (QUAY_TEST_MODE=single) or the 3-broker test
cluster (cluster): changes go through broker "a"'s API, and are checked with
pika and HTTP on broker "b" (and "c"). A single broker is its own "other
broker". The restart test starts a quayd of its own (single) or restarts
broker a (cluster). Statuses and bodies were compared with RabbitMQ 3.10.8's
management plugin on the same requests.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F403

import pika  # noqa: E402

QUAYD = os.environ.get("QUAYD", "")
QUAYCTL = os.path.join(os.path.dirname(QUAYD), "quayctl") if QUAYD else ""

# The vhosts as defined, without their message counts (each broker counts
# the messages it holds, docs/MANAGEMENT-API.md "In a cluster").
VHOSTS = "/api/vhosts?columns=name,description,tags,default_queue_type,metadata,tracing"

# A hash RabbitMQ 3.10.8 wrote for the password "pw2" (GET /api/users/bob):
# definitions exported from RabbitMQ import as they are.
RABBIT_HASH = "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND"


def nodes():
    """(A, B, C): where changes are made, and where they are checked
    (quaytest's Node: the one broker three times when single)."""
    return broker_node("a"), broker_node("b"), broker_node("c")


def ok(status_body, expected, what):
    status, body = status_body
    eq(status, expected, "%s (%r)" % (what, body))
    return body


def put_user(node, name, password, tags=""):
    return node.api("PUT", "/api/users/" + name, {"password": password, "tags": tags})


def put_permission(node, vhost, user, configure=".*", write=".*", read=".*"):
    return node.api("PUT", "/api/permissions/%s/%s" % (vhost.replace("/", "%2F"), user),
                    {"configure": configure, "write": write, "read": read})


def has_user(node, name):
    return any(u["name"] == name for u in node.get("/api/users"))


def permission_on(node, vhost, user):
    status, body = node.api("GET", "/api/permissions/%s/%s" % (vhost, user))
    return body if status == 200 else None


def expect_closed(conn, code, text):
    """The broker closes conn with code and text (within a few seconds)."""
    deadline = time.time() + 10
    try:
        while time.time() < deadline:
            conn.process_data_events(time_limit=0.2)
        raise AssertionError("connection not closed")
    except pika.exceptions.ConnectionClosedByBroker as e:
        eq(e.reply_code, code)
        eq(e.reply_text, text)


@test(timeout=60)
def the_users_file_seeds_the_users():
    """Every broker started with the same file; in a cluster one of them
    proposed it to the map (users.bootstrap), and every broker has it."""
    for n in nodes():
        wait_until(lambda: has_user(n, "filer") and permission_on(n, "v-file", "filer"),
                   timeout=10, what="filer on %s" % n.name)
        eq(permission_on(n, "v-file", "filer"),
           {"user": "filer", "vhost": "v-file", "configure": "^f-",
            "write": "^f-|^amq\\.default$", "read": "^f-"})
        eq(permission_on(n, "%2F", "filer")["configure"], ".*")
        eq(n.get("/api/users/filer")["tags"], ["management"])
        conn = n.connect("filer", "guest", "v-file")
        ch = conn.channel()
        ch.queue_declare("f-%s" % n.name)
        try:
            ch.queue_declare("other")
            raise AssertionError("the file's permission did not hold")
        except pika.exceptions.ChannelClosedByBroker as e:
            eq(e.reply_code, 403)
        conn.close()


@test(timeout=60)
def users_vhosts_permissions_through_the_api():
    a, b, c = nodes()
    ok(a.api("PUT", "/api/vhosts/v-users"), 201, "a new vhost")
    ok(a.api("PUT", "/api/vhosts/v-users"), 204, "the same vhost again")
    ok(put_user(a, "alice", "wonder", "management"), 201, "a new user")
    ok(a.api("PUT", "/api/users/alice", {"password": "land", "tags": ["management"]}), 204,
       "a changed user (tags as a list, as 3.10 takes them)")
    ok(put_permission(a, "v-users", "alice"), 201, "a new permission")
    for n in (b, c):
        wait_until(lambda: has_user(n, "alice") and permission_on(n, "v-users", "alice"),
                   timeout=10, what="alice and her permission on %s" % n.name)
        user = n.get("/api/users/alice")
        eq(user["tags"], ["management"])
        eq(user["hashing_algorithm"], "rabbit_password_hashing_sha256")
        eq(user["limits"], {})
        eq(permission_on(n, "v-users", "alice"),
           {"user": "alice", "vhost": "v-users", "configure": ".*", "write": ".*", "read": ".*"})
        # the creator of a vhost gets full permissions on it (RabbitMQ)
        assert permission_on(n, "v-users", "guest") is not None
        assert any(v["name"] == "v-users" for v in n.get("/api/vhosts"))
    eq(b.get("/api/users/alice/permissions"),
       [{"user": "alice", "vhost": "v-users", "configure": ".*", "write": ".*", "read": ".*"}])
    # the changed password logs in on another broker; the old one does not
    conn = b.connect("alice", "land", "v-users")
    conn.channel().queue_declare("alice-q")
    conn.close()
    try:
        b.connect("alice", "wonder", "v-users")
        raise AssertionError("the old password still logs in")
    except pika.exceptions.ProbableAuthenticationError:
        pass
    eq(b.api("GET", "/api/whoami", user="alice", password="land"),
       (200, {"name": "alice", "tags": ["management"]}))
    # no permission on "/": that vhost is refused to her
    try:
        c.connect("alice", "land", "/")
        raise AssertionError("alice opened / without a permission")
    except pika.exceptions.ProbableAccessDeniedError:
        pass
    # a hash exported from RabbitMQ logs in as its password
    ok(a.api("PUT", "/api/users/rabbit", {"password_hash": RABBIT_HASH, "tags": "",
                                          "hashing_algorithm":
                                          "rabbit_password_hashing_sha256"}), 201, "an import")
    ok(put_permission(a, "v-users", "rabbit"), 201, "rabbit's permission")
    wait_until(lambda: permission_on(c, "v-users", "rabbit"), timeout=10, what="rabbit on c")
    eq(c.get("/api/users/rabbit")["password_hash"], RABBIT_HASH)
    c.connect("rabbit", "pw2", "v-users").close()
    # only an administrator changes users
    eq(b.api("PUT", "/api/users/mallory", {"password": "x", "tags": ""}, user="alice",
             password="land"),
       (401, {"error": "not_authorised", "reason": "Not administrator user"}))
    eq(b.api("PUT", "/api/vhosts/v-alice", user="alice", password="land")[0], 401)


@test(timeout=60)
def bad_input_is_refused_and_changes_nothing():
    a, b, _ = nodes()
    before = (a.get("/api/users"), a.get("/api/permissions"), a.get(VHOSTS))
    cases = [
        ("PUT", "/api/users/eve", b'{"password": "x", "tags": ', "not_json"),
        ("PUT", "/api/users/eve", b'[1]', "not_json"),
        ("PUT", "/api/users/eve", {"password": "x"}, "tags_not_present"),
        ("PUT", "/api/users/eve", {"password": 5, "tags": ""}, "'password' must be a string"),
        ("PUT", "/api/users/eve", {"password_hash": RABBIT_HASH, "tags": "",
                                   "hashing_algorithm": "rabbit_password_hashing_sha1"},
         "unknown hashing_algorithm"),
        ("PUT", "/api/users/eve", {"password_hash": RABBIT_HASH, "tags": "",
                                   "hashing_algorithm": "rabbit_password_hashing_md5"},
         "not a hash of its hashing_algorithm"),
        ("PUT", "/api/users/eve", {"password_hash": "not base64!", "tags": ""}, "not_base64"),
        ("PUT", "/api/users/eve", {"password": "x", "tags": "superuser"}, "unknown tag"),
        ("PUT", "/api/users/alice", {"password": "x", "tags": "bogus"}, "unknown tag"),
        ("PUT", "/api/permissions/v-users/alice",
         {"configure": "(", "write": ".*", "read": ".*"}, "invalid_regexp"),
        ("PUT", "/api/permissions/v-users/alice", {"configure": "^a"}, "key_missing: write"),
        ("PUT", "/api/permissions/v-users/nobody",
         {"configure": ".*", "write": ".*", "read": ".*"}, "vhost_or_user_not_found"),
        ("PUT", "/api/permissions/no-vhost/alice",
         {"configure": ".*", "write": ".*", "read": ".*"}, "vhost_or_user_not_found"),
        ("PUT", "/api/vhosts/v-bad", b"{nope", "not_json"),
        ("PUT", "/api/permissions/v-users/alice",
         {"configure": "^a\u0000|.*", "write": ".*", "read": ".*"}, "without NUL"),
        ("PUT", "/api/users/alice", {"password": "x", "tags": "management\u0000administrator"},
         "holds a NUL"),
    ]
    for method, path, body, reason in cases:
        status, answer = a.api(method, path, body)
        eq(status, 400, "%s %s %r: %r" % (method, path, body, answer))
        eq(answer["error"], "bad_request")
        assert reason in answer["reason"], (reason, answer)
    for method, path in (("GET", "/api/users/nobody"), ("DELETE", "/api/users/nobody"),
                         ("GET", "/api/vhosts/nothing"), ("DELETE", "/api/vhosts/nothing"),
                         ("GET", "/api/permissions/%2F/alice"),
                         ("DELETE", "/api/permissions/%2F/alice")):
        eq(a.api(method, path), (404, {"error": "Object Not Found", "reason": "Not Found"}),
           "%s %s" % (method, path))
    time.sleep(0.3)
    for n in (a, b):
        eq((n.get("/api/users"), n.get("/api/permissions"), n.get(VHOSTS)), before,
           "nothing changed on %s" % n.name)
    # the old password still works: the refused PUT of alice did nothing
    b.connect("alice", "land", "v-users").close()


@test(timeout=60)
def permission_change_holds_for_open_connections():
    a, b, _ = nodes()
    conn = b.connect("alice", "land", "v-users")
    ch = conn.channel()
    ch.queue_declare("free-before")
    cached = conn.channel()  # its publishes to "" have been permitted once
    cached.confirm_delivery()
    cached.basic_publish("", "free-before", b"before")
    multi = conn.channel()  # publishes to two exchanges in turn: each permitted once
    multi.confirm_delivery()
    for _ in range(2):
        multi.basic_publish("amq.direct", "free-before", b"before")
        multi.basic_publish("", "free-before", b"before")
    ok(put_permission(a, "v-users", "alice", "^allowed-", "^allowed-|^amq\\.default$",
                      "^allowed-"), 204, "a changed permission")
    wait_until(lambda: permission_on(b, "v-users", "alice")["configure"] == "^allowed-",
               timeout=10, what="the change on b")
    multi.basic_publish("", "free-before", b"still")  # amq.default is still allowed
    try:
        multi.basic_publish("amq.direct", "free-before", b"after")
        raise AssertionError("a publish kept its permitted exchange after a change")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
        eq(e.reply_text, "ACCESS_REFUSED - write access to exchange 'amq.direct' in vhost "
           "'v-users' refused for user 'alice'")
    ch.queue_declare("allowed-1")
    try:
        ch.queue_declare("other-1")
        raise AssertionError("a refused declare passed")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
        eq(e.reply_text, "ACCESS_REFUSED - configure access to queue 'other-1' in vhost "
           "'v-users' refused for user 'alice'")
    ch = conn.channel()
    ch.basic_publish("", "allowed-1", b"x")
    try:
        ch.basic_get("free-before")
        raise AssertionError("a refused get passed")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
    # cleared: the open connection may do nothing more there (RabbitMQ)
    ok(a.api("DELETE", "/api/permissions/v-users/alice"), 204, "a cleared permission")
    wait_until(lambda: permission_on(b, "v-users", "alice") is None, timeout=10,
               what="the clear on b")
    try:
        conn.channel().queue_declare("allowed-2")
        raise AssertionError("a declare passed without a permission")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
    # the channel that published before is checked again too
    try:
        cached.basic_publish("", "free-before", b"after")
        raise AssertionError("a publish passed without a permission")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
        eq(e.reply_text, "ACCESS_REFUSED - write access to exchange 'amq.default' in vhost "
           "'v-users' refused for user 'alice'")
    conn.close()
    ok(put_permission(a, "v-users", "alice"), 201, "alice's permission back")


@test(timeout=60)
def deleting_a_user_closes_its_connections_everywhere():
    a, b, c = nodes()
    ok(put_user(a, "bob", "builder"), 201, "bob")
    ok(put_permission(a, "/", "bob"), 201, "bob's permission")
    wait_until(lambda: permission_on(b, "%2F", "bob") and permission_on(c, "%2F", "bob"),
               timeout=10, what="bob everywhere")
    conns = [b.connect("bob", "builder"), c.connect("bob", "builder")]
    other = b.connect()  # another user's connection stays
    ok(a.api("DELETE", "/api/users/bob"), 204, "bob deleted")
    for conn in conns:
        expect_closed(conn, 320, "CONNECTION_FORCED - user 'bob' is deleted")
    assert other.is_open
    other.channel().queue_declare("", exclusive=True)
    other.close()
    for n in (b, c):
        wait_until(lambda: not has_user(n, "bob"), timeout=10, what="bob gone on %s" % n.name)
        try:
            n.connect("bob", "builder")
            raise AssertionError("a deleted user logged in")
        except pika.exceptions.ProbableAuthenticationError:
            pass


@test(timeout=60)
def deleting_a_vhost_deletes_its_queues_and_closes_its_connections():
    a, b, c = nodes()
    ok(a.api("PUT", "/api/vhosts/v-gone"), 201, "v-gone")
    wait_until(lambda: permission_on(b, "v-gone", "guest"), timeout=10, what="v-gone on b")
    conn = b.connect(vhost="v-gone")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dq", durable=True)
    ch.basic_publish("", "dq", b"kept?", pika.BasicProperties(delivery_mode=2))
    ok(a.api("DELETE", "/api/vhosts/v-gone"), 204, "v-gone deleted")
    expect_closed(conn, 320, "CONNECTION_FORCED - vhost 'v-gone' is deleted")
    for n in (b, c):
        wait_until(lambda: n.api("GET", "/api/vhosts/v-gone")[0] == 404, timeout=10,
                   what="v-gone gone on %s" % n.name)
        assert permission_on(n, "v-gone", "guest") is None
        assert not [q for q in n.get("/api/queues") if q.get("vhost") == "v-gone"]
    # made again, it is empty: the queue went with the vhost everywhere
    ok(a.api("PUT", "/api/vhosts/v-gone"), 201, "v-gone again")
    wait_until(lambda: permission_on(c, "v-gone", "guest"), timeout=10, what="v-gone again")
    conn = c.connect(vhost="v-gone")
    try:
        conn.channel().queue_declare("dq", passive=True)
        raise AssertionError("the deleted vhost's queue came back")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 404)
    conn.close()


@test(timeout=90)
def quayctl_manages_users():
    a, b, _ = nodes()
    ctl = [QUAYCTL, "--http", "127.0.0.1:%d" % a.http_port]

    def run_ctl(*args):
        out = subprocess.run(ctl + list(args), capture_output=True, text=True, timeout=30)
        eq(out.returncode, 0, "quayctl %s: %s" % (" ".join(args), out.stderr))
        return out.stdout
    run_ctl("add-vhost", "v-ctl")
    run_ctl("add-user", "carol", "secret", "--tags", "management,policymaker")
    run_ctl("set-permissions", "-p", "v-ctl", "carol", "^c-", "^c-", "")

    def rows(text):
        return [line.split() for line in text.splitlines()[1:]]
    assert ["carol", "policymaker,management"] in rows(run_ctl("list-users"))
    assert ["v-ctl"] in rows(run_ctl("list-vhosts"))
    assert ["carol", "v-ctl", "^c-", "^c-"] in rows(run_ctl("list-permissions"))
    eq(sorted(r[0] for r in rows(run_ctl("list-permissions", "-p", "v-ctl"))),
       ["carol", "guest"])  # guest made v-ctl: it has .* there
    run_ctl("change-password", "carol", "s3cret")
    run_ctl("set-user-tags", "carol", "monitoring")
    wait_until(lambda: has_user(b, "carol") and
               b.get("/api/users/carol")["tags"] == ["monitoring"], timeout=10,
               what="carol's tags on b")
    eq(b.api("GET", "/api/vhosts/v-ctl/permissions", user="carol", password="s3cret"),
       (401, {"error": "not_authorised", "reason": "Not administrator user"}))
    conn = b.connect("carol", "s3cret", "v-ctl")  # the password stayed through set-user-tags
    conn.channel().queue_declare("c-1")
    conn.close()
    run_ctl("clear-permissions", "-p", "v-ctl", "carol")
    run_ctl("delete-user", "carol")
    run_ctl("delete-vhost", "v-ctl")
    out = subprocess.run(ctl + ["delete-user", "carol"], capture_output=True, text=True,
                         timeout=30)
    eq(out.returncode, 76, out.stderr)
    assert "404" in out.stderr, out.stderr


def restart_single():
    """A quayd of its own: users made through its API survive SIGTERM and a
    start with a users file that says otherwise (the file seeds only the
    first start)."""
    tmp = tempfile.mkdtemp(prefix="quay-users-")
    users = os.path.join(tmp, "users")
    guest_hash = subprocess.run([QUAYD, "--hash-password", "guest"], capture_output=True,
                                text=True, check=True).stdout.strip()
    with open(users, "w") as f:
        f.write("guest %s / loopback tags=administrator\n" % guest_hash)
    own = Restartable(["--users", users], http=True)  # (quaytest's)
    n = own.node()
    own.start()
    try:
        ok(n.api("PUT", "/api/vhosts/v-kept"), 201, "v-kept")
        ok(put_user(n, "dave", "pw", "monitoring"), 201, "dave")
        ok(put_permission(n, "v-kept", "dave", "^d-", ".*", ".*"), 201, "dave's permission")
        ok(put_user(n, "gone", "pw"), 201, "gone")
        ok(n.api("DELETE", "/api/users/gone"), 204, "gone deleted")
    finally:
        own.stop()
    with open(users, "w") as f:  # ignored now: the journal has the users
        f.write("guest %s / loopback tags=administrator\nfileonly %s /\n"
                % (guest_hash, guest_hash))
    own.start()
    try:
        eq(sorted(u["name"] for u in n.get("/api/users")), ["dave", "guest"])
        eq(n.get("/api/users/dave")["tags"], ["monitoring"])
        eq(permission_on(n, "v-kept", "dave")["configure"], "^d-")
        n.connect("dave", "pw", "v-kept").close()
    finally:
        own.stop()


@test(timeout=120)
def users_survive_a_restart():
    if not CLUSTERED:
        restart_single()
        return
    a, b, _ = nodes()
    member = broker().member("a")
    member.restart()
    wait_until(lambda: port_accepts(a.http_port), timeout=30, what="a back")
    wait_until(lambda: has_user(a, "alice") and permission_on(a, "v-users", "alice"),
               timeout=30, what="alice on the restarted broker")
    a.connect("alice", "land", "v-users").close()
    assert not has_user(a, "bob")
    eq(a.api("GET", "/api/vhosts/v-ctl")[0], 404)


def rabbit_hash(password, algorithm="sha256", salt=b"\x90\x8f\x1f\x5e"):
    """RabbitMQ's stored form: base64(salt || H(salt || password))."""
    import base64
    import hashlib
    return base64.b64encode(salt + hashlib.new(algorithm, salt + password.encode()).digest()
                            ).decode()


def rabbit_definitions():
    """Definitions as RabbitMQ 3.10.8 exports them (its field names, a
    user in each of its two SHA forms, vhost metadata quay ignores), with
    a queue in a vhost the file itself creates."""
    return {
        "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8",
        "product_name": "RabbitMQ", "product_version": "3.10.8",
        "users": [
            {"name": "imp-alice", "password_hash": RABBIT_HASH,
             "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"],
             "limits": {}},
            {"name": "imp-bob", "password_hash": rabbit_hash("bob-pw", "sha512"),
             "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": "", "limits": {}}],
        "vhosts": [{"name": "imp-v1", "limits": [], "metadata": {"description": "",
                                                                  "tags": []}},
                   {"name": "imp-v2"}],
        "permissions": [
            {"user": "imp-alice", "vhost": "imp-v1", "configure": ".*", "write": ".*",
             "read": ".*"},
            {"user": "imp-bob", "vhost": "imp-v2", "configure": "^bob-", "write": ".*",
             "read": ".*"},
            {"user": "guest", "vhost": "imp-v1", "configure": ".*", "write": ".*",
             "read": ".*"}],
        "topic_permissions": [], "parameters": [], "global_parameters": [], "policies": [],
        "queues": [{"name": "imp-q", "vhost": "imp-v1", "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "exchanges": [], "bindings": []}


@test(timeout=90)
def definitions_import_users_vhosts_and_permissions():
    """A RabbitMQ 3.10 definitions file creates its users (with RabbitMQ's
    hashes: the passwords log in over AMQP), vhosts and permissions, on
    every broker, through any broker's API (b: no leader, no primary of
    anything here); the imported permissions refuse as RabbitMQ's do; a
    file with one bad item changes nothing and says where the item is."""
    a, b, c = nodes()
    defs = rabbit_definitions()
    ok(b.api("POST", "/api/definitions", defs), 204, "the import")
    for n in (a, b, c):
        wait_until(lambda: permission_on(n, "imp-v2", "imp-bob"), timeout=10,
                   what="the import on %s" % n.name)
        user = n.get("/api/users/imp-alice")
        eq((user["password_hash"], user["hashing_algorithm"], user["tags"]),
           (RABBIT_HASH, "rabbit_password_hashing_sha256", ["management"]))
        eq(n.get("/api/users/imp-bob")["hashing_algorithm"], "rabbit_password_hashing_sha512")
        eq(permission_on(n, "imp-v2", "imp-bob"),
           {"user": "imp-bob", "vhost": "imp-v2", "configure": "^bob-", "write": ".*",
            "read": ".*"})
    conn = c.connect("imp-alice", "pw2", "imp-v1")
    eq(conn.channel().queue_declare("imp-q", passive=True).method.queue, "imp-q")
    conn.close()
    # No permission on imp-v2: the vhost is refused to her (530, as RabbitMQ).
    try:
        a.connect("imp-alice", "pw2", "imp-v2")
        raise AssertionError("imp-alice opened imp-v2 without a permission")
    except pika.exceptions.ProbableAccessDeniedError:
        pass
    try:
        c.connect("imp-bob", "wrong", "imp-v2")
        raise AssertionError("a wrong password logged in")
    except pika.exceptions.ProbableAuthenticationError:
        pass
    conn = c.connect("imp-bob", "bob-pw", "imp-v2")
    ch = conn.channel()
    ch.queue_declare("bob-q")
    try:
        ch.queue_declare("other-q")
        raise AssertionError("a declare outside bob's configure regex passed")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq((e.reply_code, e.reply_text), (403, "ACCESS_REFUSED - configure access to queue "
                                               "'other-q' in vhost 'imp-v2' refused for user "
                                               "'imp-bob'"))
    conn.close()
    # Again, changed: tags and a password change; permissions it does not
    # name stay (bob's).
    defs["users"] = [dict(defs["users"][0], tags="administrator,management",
                          password_hash=rabbit_hash("new-pw"))]
    defs["permissions"] = []
    ok(b.api("POST", "/api/definitions", defs), 204, "the import again")
    wait_until(lambda: c.get("/api/users/imp-alice")["tags"] == ["administrator", "management"],
               timeout=10, what="the changed tags on c")
    c.connect("imp-alice", "new-pw", "imp-v1").close()
    assert permission_on(a, "imp-v2", "imp-bob") is not None
    # The export carries them back as they came.
    exported = a.get("/api/definitions")
    mine = [u for u in exported["users"] if u["name"] == "imp-bob"]
    eq([(u["password_hash"], u["hashing_algorithm"]) for u in mine],
       [(rabbit_hash("bob-pw", "sha512"), "rabbit_password_hashing_sha512")])
    # One bad item anywhere: 400 naming it, and nothing of the file applied.
    before = (a.get("/api/users"), a.get("/api/permissions"), a.get(VHOSTS))
    fresh = {"users": [{"name": "imp-carol", "password_hash": rabbit_hash("c"),
                        "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}],
             "vhosts": [{"name": "imp-v3"}],
             "permissions": [{"user": "guest", "vhost": "imp-v3", "configure": ".*",
                              "write": ".*", "read": ".*"}],
             "queues": [{"name": "imp-q3", "vhost": "imp-v3", "durable": True,
                         "auto_delete": False, "arguments": {}}]}
    bad_items = [
        ("permissions", [{"user": "imp-carol", "vhost": "imp-v3", "configure": ".*",
                          "write": ".*", "read": ".*"},
                         {"user": "imp-carol", "vhost": "imp-v3", "configure": "(",
                          "write": ".*", "read": ".*"}], "permissions[1]: invalid_regexp"),
        ("permissions", [{"user": "nobody", "vhost": "imp-v3", "configure": ".*",
                          "write": ".*", "read": ".*"}], "permissions[0]: user 'nobody'"),
        ("permissions", [{"user": "imp-carol", "vhost": "no-vhost", "configure": ".*",
                          "write": ".*", "read": ".*"}], "permissions[0]: vhost 'no-vhost'"),
        ("users", fresh["users"] + [{"name": "imp-dave", "password_hash": "not base64!",
                                     "tags": []}], "users[1]: 'imp-dave': password_hash"),
        ("users", fresh["users"] + [{"name": "imp-dave", "password_hash": RABBIT_HASH,
                                     "hashing_algorithm": "rabbit_password_hashing_sha1"}],
         "users[1]: 'imp-dave' has an unknown hashing_algorithm"),
        ("users", [{"name": "imp-dave", "password_hash": RABBIT_HASH, "tags": ["wizard"]}],
         "users[0]: 'imp-dave': tags"),
        ("vhosts", [{"name": "imp-v3"}, {"nom": "x"}], "vhosts[1]: no name"),
        ("queues", fresh["queues"] + [{"name": "q", "vhost": "imp-v9", "durable": True,
                                       "auto_delete": False, "arguments": {}}],
         "queues[1]: vhost 'imp-v9' neither exists nor is in the definitions"),
    ]
    for key, value, reason in bad_items:
        status, answer = b.api("POST", "/api/definitions", dict(fresh, **{key: value}))
        eq(status, 400, "%s %r: %r" % (key, value, answer))
        assert reason in answer["reason"], (reason, answer)
    time.sleep(0.3)
    for n in (a, b, c):
        eq((n.get("/api/users"), n.get("/api/permissions"), n.get(VHOSTS)), before,
           "nothing of a refused import on %s" % n.name)
    # An importer without a permission on a vhost it fills is refused first.
    status, answer = b.api("POST", "/api/definitions", {"queues": fresh["queues"],
                                                        "vhosts": fresh["vhosts"]})
    eq(status, 400, answer)
    assert "the importing user 'guest' has no permission on vhost 'imp-v3'" in \
        answer["reason"], answer
    eq(a.api("GET", "/api/vhosts/imp-v3")[0], 404)


def seed_file():
    """The users file every broker starts with: guest, and "filer" with a
    vhost of its own and a permission line."""
    path = os.path.join(tempfile.mkdtemp(prefix="quay-users-"), "users")
    h = subprocess.run([QUAYD, "--hash-password", "guest"], capture_output=True, text=True,
                       check=True).stdout.strip()
    with open(path, "w") as f:
        f.write("guest %s / loopback tags=administrator\n"
                "filer %s /,v-file tags=management\n"
                "permission filer v-file ^f- ^f-|^amq\\.default$ ^f-\n" % (h, h))
    return path


if __name__ == "__main__":
    quaytest._broker = Broker(["--users", seed_file()], external_ok=False, http=True)
    run()
