"""Goal: RabbitMQ's own command-line tool, rabbitmqadmin (as Debian's
rabbitmq-server ships it, unchanged), works against quay's management API
for its list, show, declare, delete, purge, publish, get, export and import
commands; what it lists agrees with what an AMQP client sees; definitions
go both ways between quay and RabbitMQ 3.10; bad input gets RabbitMQ's
statuses and error shape.

Method: one quayd with --http (quaytest.Broker), or in cluster mode three
brokers with rabbitmqadmin pointed at broker "b", which places every queue
on another broker (--queue-locator others): every queue it lists, declares,
publishes to or gets from has its primary elsewhere. rabbitmqadmin runs as a
subprocess of /usr/bin/python3 (-f raw_json where the test reads its
answer); pika on the same broker is the AMQP view it is compared with
(queue.declare passive: message and consumer counts). The definitions
round trip starts a RabbitMQ 3.10 node by hand with its management plugin
on free ports (as /work/shared/bench/run-rabbitmq.sh does), when
rabbitmq-server is installed: a quay export is imported into it, and its
export (with the same objects and its own extra, RabbitMQ-only fields)
into quay; the queues' RabbitMQ fields are compared field by field.
"""
import atexit
import glob
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F403

import pika  # noqa: E402

RMQ_HOME = (sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-3.*")) or [""])[-1]
ADMIN = (glob.glob(RMQ_HOME + "/plugins/rabbitmq_management-*/priv/www/cli/rabbitmqadmin")
         or [""])[0]

_qb = None


def qbroker():
    """The quayd (or cluster) with the API on, started once for this file."""
    global _qb
    if _qb is None:
        b = Broker(external_ok=False, http=True)
        atexit.register(lambda: b.proc and b.proc.poll() is None and b.proc.kill())
        _qb = b
        wait_until(lambda: _port_open(b.http_port), 20, what="the HTTP listener")
    return _qb


def _port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


def admin(*args, port=None, check=True, stdin=None):
    """rabbitmqadmin ARGS against the broker's API: (exit code, stdout+stderr)."""
    assert ADMIN, "rabbitmqadmin not found under /usr/lib/rabbitmq (scripts/setup.sh " \
                  "installs rabbitmq-server)"
    cmd = ["/usr/bin/python3", ADMIN, "-H", "127.0.0.1", "-P", str(port or qbroker().http_port),
           "-u", "guest", "-p", "guest"] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, input=stdin)
    out = p.stdout + p.stderr
    if check:
        eq(p.returncode, 0, "rabbitmqadmin %s: %s" % (" ".join(args), out))
    return p.returncode, out


def admin_json(*args, port=None):
    return json.loads(admin("-f", "raw_json", *args, port=port)[1])


def amqp():
    b = qbroker()
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", b.port, heartbeat=0, blocked_connection_timeout=30))


def amqp_counts(name):
    """(messages ready, consumers) as AMQP reports them (queue.declare passive)."""
    c = amqp()
    try:
        ok = c.channel().queue_declare(name, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        c.close()


def amqp_exists(name):
    c = amqp()
    try:
        c.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 404, "passive declare of a missing queue")
        return False
    finally:
        if c.is_open:
            c.close()


def listed(name, port=None):
    q = [x for x in admin_json("list", "queues", port=port) if x["name"] == name]
    return q[0] if q else None


def http_call(method, path, body=None, port=None, ctype="application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", port or qbroker().http_port, timeout=15)
    headers = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}
    if body is not None:
        headers["Content-Type"] = ctype
    conn.request(method, path, body, headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, (json.loads(data) if data else None)


def primary_elsewhere(name):
    """Cluster mode: the queue's primary is not the broker rabbitmqadmin asks."""
    b = qbroker()
    if b.cluster is None:
        return
    p = b.primary_of(name)
    assert p is not None and p.name != b.client.name, (name, p)


@test(timeout=120)
def declare_list_and_compare_with_amqp():
    admin("declare", "queue", "name=adm-q1", "durable=true")
    admin("declare", "queue", "name=adm-q2", "durable=false",
          'arguments={"x-max-length": 100}')
    assert amqp_exists("adm-q1") and amqp_exists("adm-q2")
    primary_elsewhere("adm-q1")
    # Redeclaring differently is RabbitMQ's 400 with its reason, and a
    # failing exit code from the tool.
    rc, out = admin("declare", "queue", "name=adm-q1", "durable=false", check=False)
    assert rc != 0 and "inequivalent arg 'durable'" in out, out
    for i in range(7):
        admin("publish", "routing_key=adm-q1", "payload=m%d" % i)
    c = amqp()
    ch = c.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("adm-q2", lambda *a: None, consumer_tag="adm-tag")
    try:
        def agree():
            q1, q2 = listed("adm-q1"), listed("adm-q2")
            return (q1 and q2 and (q1["messages_ready"], q1["consumers"]) == amqp_counts("adm-q1")
                    and (q2["messages_ready"], q2["consumers"]) == amqp_counts("adm-q2")
                    and q1["messages_ready"] == 7 and q2["consumers"] == 1)
        wait_until(agree, 10, what="rabbitmqadmin's list queues to agree with AMQP")
        q1 = listed("adm-q1")
        eq((q1["durable"], q1["auto_delete"], q1["exclusive"], q1["messages"], q1["state"],
            q1["type"], q1["vhost"]), (True, False, False, 7, "running", "classic", "/"),
           "adm-q1's RabbitMQ fields")
        eq(listed("adm-q2")["arguments"], {"x-max-length": 100}, "arguments")
        if qbroker().cluster is not None:
            eq(q1["counts_from"], "primary", "a stand-in's counts come from the primary")
            eq(q1["node"], qbroker().primary_of("adm-q1").name, "node: the primary")
        # The default table view: columns name and messages, sorted by name.
        out = admin("list", "queues")[1]
        assert "| adm-q1 | 7 " in out.replace("  ", " ").replace("  ", " "), out
        out = admin("list", "queues", "name", "messages_ready", "--sort=name",
                    "--sort-reverse")[1]
        assert out.index("adm-q2") < out.index("adm-q1"), out
        # Consumers, channels and connections of the pika client.
        cons = [x for x in admin_json("list", "consumers") if x["consumer_tag"] == "adm-tag"]
        eq(len(cons), 1, "the consumer listed")
        eq((cons[0]["queue"]["name"], cons[0]["ack_required"], cons[0]["prefetch_count"]),
           ("adm-q2", True, 2), "consumer fields (basic.qos before it)")
        chans = admin_json("list", "channels")
        assert any(x["consumer_count"] == 1 and x["prefetch_count"] == 2 for x in chans), chans
        conns = admin_json("list", "connections")
        assert any(x["user"] == "guest" and x["channels"] == 1 and x["protocol"] == "AMQP 0-9-1"
                   for x in conns), conns
    finally:
        c.close()


@test(timeout=120)
def publish_get_purge_and_delete():
    admin("declare", "queue", "name=adm-g")
    primary_elsewhere("adm-g")
    admin("publish", "routing_key=adm-g", "payload=hello",
          'properties={"delivery_mode": 2, "headers": {"h": "v", "n": 5}, '
          '"content_type": "text/plain"}')
    admin("publish", "routing_key=adm-g", stdin="from stdin")
    got = admin_json("get", "queue=adm-g", "count=5", "ackmode=ack_requeue_true")
    eq(len(got), 2, "two messages")
    eq((got[0]["payload"], got[0]["payload_encoding"], got[0]["payload_bytes"],
        got[0]["routing_key"], got[0]["exchange"], got[0]["message_count"]),
       ("hello", "string", 5, "adm-g", "", 1), "first message")
    eq(got[0]["properties"], {"delivery_mode": 2, "headers": {"h": "v", "n": 5},
                              "content_type": "text/plain"}, "properties")
    eq(got[1]["payload"], "from stdin", "second message")
    # ack_requeue_true put them back, before the answer.
    eq(amqp_counts("adm-g")[0], 2, "requeued")
    got = admin_json("get", "queue=adm-g", "count=1", "ackmode=ack_requeue_false")
    eq((len(got), got[0]["redelivered"]), (1, True), "taken, redelivered")
    eq(amqp_counts("adm-g")[0], 1, "one left")
    admin("purge", "queue", "name=adm-g")
    eq(amqp_counts("adm-g")[0], 0, "purged")
    eq(admin_json("get", "queue=adm-g"), [], "nothing to get")
    admin("delete", "queue", "name=adm-g")
    assert not amqp_exists("adm-g")
    rc, out = admin("delete", "queue", "name=adm-g", check=False)
    assert rc != 0 and "Not found" in out, out


@test(timeout=120)
def exchanges_bindings_and_routing():
    admin("declare", "exchange", "name=adm-x", "type=topic")
    admin("declare", "queue", "name=adm-b")
    admin("declare", "binding", "source=adm-x", "destination=adm-b", "routing_key=a.#")
    xs = [x for x in admin_json("list", "exchanges") if x["name"] == "adm-x"]
    eq([(x["type"], x["durable"], x["internal"]) for x in xs], [("topic", True, False)],
       "the exchange")
    bs = [b for b in admin_json("list", "bindings") if b["source"] == "adm-x"]
    eq([(b["destination"], b["destination_type"], b["routing_key"], b["properties_key"])
        for b in bs], [("adm-b", "queue", "a.#", "a.#")], "the binding")
    # The default exchange's implicit binding is listed, as in RabbitMQ.
    assert any(b["source"] == "" and b["destination"] == "adm-b"
               for b in admin_json("list", "bindings")), "default binding"
    out = admin("publish", "exchange=adm-x", "routing_key=a.b", "payload=x")[1]
    assert "Message published" in out and "NOT routed" not in out, out
    out = admin("publish", "exchange=adm-x", "routing_key=b.b", "payload=x")[1]
    assert "NOT routed" in out, out
    eq(amqp_counts("adm-b")[0], 1, "routed once")
    admin("delete", "binding", "source=adm-x", "destination=adm-b",
          "destination_type=queue", "properties_key=a.#")
    eq([b for b in admin_json("list", "bindings") if b["source"] == "adm-x"], [], "unbound")
    out = admin("publish", "exchange=adm-x", "routing_key=a.b", "payload=x")[1]
    assert "NOT routed" in out, out
    admin("delete", "exchange", "name=adm-x")
    admin("delete", "queue", "name=adm-b")
    eq([x for x in admin_json("list", "exchanges") if x["name"] == "adm-x"], [], "deleted")


@test(timeout=60)
def show_overview_nodes_and_health():
    out = admin("show", "overview")[1]
    assert "rabbitmq_version" in out and "object_totals.queues" in out, out
    ov = admin_json("show", "overview")
    assert isinstance(ov[0]["object_totals"]["queues"], int), ov
    nodes = admin_json("list", "nodes")
    b = qbroker()
    want = 1 if b.cluster is None else 3
    eq(len(nodes), want, "one node per broker")
    assert all(n["running"] and n["type"] == "disc" for n in nodes), nodes
    for path in ("/api/healthchecks/node", "/api/health/checks/alarms",
                 "/api/health/checks/local-alarms", "/api/aliveness-test/%2F"):
        eq(http_call("GET", path), (200, {"status": "ok"}), path)


@test(timeout=60)
def the_other_health_checks_answer_as_rabbitmq():
    # RabbitMQ 3.10's /api/health/checks/*, each answer as 3.10.8 (run by
    # hand with its management plugin) gave to the same request.
    b = qbroker()
    ok = {"status": "ok"}
    eq(http_call("GET", "/api/health/checks/port-listener/%d" % b.port),
       (200, {"status": "ok", "port": b.port}), "the AMQP port")
    eq(http_call("GET", "/api/health/checks/port-listener/%d" % b.http_port),
       (200, {"status": "ok", "port": b.http_port}), "the API's port")
    st, body = http_call("GET", "/api/health/checks/port-listener/1")
    eq((st, body["status"], body["reason"], body["missing"]),
       (503, "failed", "No active listener", 1), "a port not listened on")
    assert b.port in body["ports"] and b.http_port in body["ports"], body
    eq(http_call("GET", "/api/health/checks/port-listener/abc"),
       (400, {"error": "bad_request", "reason": "Invalid port"}), "not a port")
    for name in ("amqp", "amqp091", "http"):
        eq(http_call("GET", "/api/health/checks/protocol-listener/" + name),
           (200, {"status": "ok", "protocol": "amqp" if name != "http" else "http"}), name)
    st, body = http_call("GET", "/api/health/checks/protocol-listener/amqps")
    eq((st, body["status"], body["missing"]), (503, "failed", "amqp/ssl"), "no AMQPS")
    assert "amqp" in body["protocols"], body
    eq(http_call("GET", "/api/health/checks/virtual-hosts"), (200, ok), "vhosts")
    eq(http_call("GET", "/api/health/checks/certificate-expiration/1/months"), (200, ok),
       "no certificate to expire")
    eq(http_call("GET", "/api/health/checks/certificate-expiration/1/bogus"),
       (400, {"error": "bad_request", "reason": "Time unit not recognised. Supported units: "
                                                "days, weeks, months, years."}), "bad unit")
    eq(http_call("GET", "/api/health/checks/certificate-expiration/x/months")[0], 400, "bad n")
    eq(http_call("GET", "/api/health/checks/certificate-expiration/1"),
       (404, {"error": "Object Not Found", "reason": "Not Found"}), "unit missing")
    eq(http_call("GET", "/api/health/checks/nosuch")[0], 404, "unknown check")
    checks = ("/api/health/checks/node-is-quorum-critical",
              "/api/health/checks/node-is-mirror-sync-critical")
    if b.cluster is None:
        for path in checks:
            eq(http_call("GET", path), (200, {"status": "ok", "reason": "single node cluster"}),
               path)
        return
    eq(http_call("GET", "/api/health/checks/protocol-listener/clustering"),
       (200, {"status": "ok", "protocol": "clustering"}), "the cluster's port")
    # Three voters up: stopping one leaves two, a majority; every queue's
    # backups in sync once the cluster settled.
    for path in checks:
        wait_until(lambda: http_call("GET", path) == (200, ok), 20, what=path)


@test(timeout=60)
def parameters_and_operator_policies_list_as_rabbitmq():
    # rabbitmqadmin's "list parameters" and "list operator_policies" (and
    # the paths beside them) answer as RabbitMQ 3.10.8 did to the same
    # requests: quay's only runtime parameters are vhost limits.
    item = {"value": {"max-connections": 10}, "vhost": "/", "component": "vhost-limits",
            "name": "limits"}
    eq(http_call("PUT", "/api/vhost-limits/%2F/max-connections", '{"value": 10}')[0], 204,
       "a vhost limit")
    try:
        wait_until(lambda: http_call("GET", "/api/parameters") == (200, [item]), 10,
                   what="the limit listed")
        for path in ("/api/parameters/vhost-limits", "/api/parameters/vhost-limits/%2F"):
            eq(http_call("GET", path), (200, [item]), path)
        eq(http_call("GET", "/api/parameters/vhost-limits/%2F/limits"), (200, item), "one")
        eq(http_call("GET", "/api/parameters/federation-upstream"), (200, []), "none such")
        for path in ("/api/parameters/vhost-limits/%2F/nope", "/api/parameters/vhost-limits/nope",
                     "/api/operator-policies/%2F/x", "/api/global-parameters/x"):
            eq(http_call("GET", path), (404, {"error": "Object Not Found",
                                              "reason": "Not Found"}), path)
        for path in ("/api/operator-policies", "/api/operator-policies/%2F",
                     "/api/topic-permissions", "/api/global-parameters"):
            eq(http_call("GET", path), (200, []), path)
        st, body = http_call("GET", "/api/cluster-name")
        eq((st, sorted(body)), (200, ["name"]), "cluster-name")
        out = admin("list", "parameters")[1]
        assert "vhost-limits" in out and "max-connections" in out, out
        eq(admin("list", "operator_policies")[1].strip(), "No items", "operator policies")
    finally:
        http_call("DELETE", "/api/vhost-limits/%2F/max-connections")


@test(timeout=60)
def policies_in_rabbitmqs_words():
    # rabbitmqadmin declares, lists and deletes a policy as RabbitMQ's
    # classic mirroring says it ({"ha-mode": "exactly", "ha-params": N}: N
    # copies, quay's N - 1 backups); what quay's policies cannot do is
    # refused with a reason, and nothing is made.
    admin("declare", "policy", "name=adm-ha", "pattern=^adm-ha\\.",
          'definition={"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}',
          "priority=5", "apply-to=queues")
    try:
        listed_p = [p for p in admin_json("list", "policies") if p["name"] == "adm-ha"]
        eq([(p["pattern"], p["definition"], p["priority"], p["apply-to"], p["backups"])
            for p in listed_p],
           [("^adm-ha\\.", {"ha-mode": "exactly", "ha-params": 2}, 5, "queues", 1)], "listed")
        if qbroker().cluster is not None:
            amqp().channel().queue_declare("adm-ha.q")
            wait_until(lambda: len((listed("adm-ha.q") or {}).get("backups", [])) == 1, 10,
                       what="the policy's one backup")
            admin("delete", "queue", "name=adm-ha.q")
        rc, out = admin("declare", "policy", "name=adm-ttl", "pattern=.*",
                        'definition={"message-ttl": 1000}', check=False)
        assert rc != 0 and "message-ttl" in out and "not supported" in out, out
        st, body = http_call("PUT", "/api/policies/%2F/adm-bad", '{"pattern": "x", "definition"')
        eq((st, body["error"]), (400, "bad_request"), body)
        assert "line 1" in body["reason"], body
        assert not [p for p in admin_json("list", "policies") if p["name"] != "adm-ha"]
    finally:
        admin("delete", "policy", "name=adm-ha", check=False)
    assert not [p for p in admin_json("list", "policies") if p["name"] == "adm-ha"], "deleted"


@test(timeout=60)
def policy_changes_answer_without_a_body_as_rabbitmq():
    # RabbitMQ 3.10.8's answers to the same requests: PUT 201 (new) or 204
    # (replaced), DELETE 204, none with a body; a vhost's policies are
    # listed at /api/policies/{vhost}, by priority, sort= and columns= as
    # any list (not paged: RabbitMQ ignores page= there).
    p = {"pattern": "^adm-pp", "definition": {"ha-mode": "exactly", "ha-params": 2}}
    try:
        eq(http_call("PUT", "/api/policies/%2F/adm-pp", json.dumps(dict(p, priority=7))),
           (201, None), "PUT of a new policy")
        eq(http_call("PUT", "/api/policies/%2F/adm-pp", json.dumps(dict(p, priority=3))),
           (204, None), "PUT of the same")
        eq(http_call("PUT", "/api/policies/%2F/adm-pq", json.dumps(dict(p, priority=9))),
           (201, None), "PUT of another")
        wait_until(lambda: http_call("GET", "/api/policies/%2F/adm-pp")[1]["priority"] == 3, 10,
                   what="the replaced policy")
        mine = lambda items: [x for x in items if x["name"].startswith("adm-p")]  # noqa: E731
        eq(mine(http_call("GET", "/api/policies/%2F?columns=name,priority")[1]),
           [{"name": "adm-pp", "priority": 3}, {"name": "adm-pq", "priority": 9}],
           "by priority, its columns")
        eq(mine(http_call("GET", "/api/policies?sort=priority&sort_reverse=true"
                                 "&columns=name,priority&page=1&page_size=1")[1]),
           [{"name": "adm-pq", "priority": 9}, {"name": "adm-pp", "priority": 3}],
           "sort_reverse, no page")
        eq(http_call("GET", "/api/policies/adm-nowhere")[0], 404, "an unknown vhost")
        out = admin("list", "policies", "name", "priority", "--sort=name", "--sort-reverse")[1]
        assert out.index("adm-pq") < out.index("adm-pp"), out
        eq(http_call("DELETE", "/api/policies/%2F/adm-pp"), (204, None), "DELETE")
        eq(http_call("DELETE", "/api/policies/%2F/adm-pp")[0], 404, "DELETE again")
    finally:
        for name in ("adm-pp", "adm-pq"):
            http_call("DELETE", "/api/policies/%2F/" + name)


def names_in(out, prefix):
    """The rows of rabbitmqadmin's table output whose first cell starts with prefix."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.split("\n")
            if line.startswith("|")]
    return [r for r in rows if r and r[0].startswith(prefix)]


@test(timeout=120)
def users_vhosts_and_permissions_with_rabbitmqadmin():
    # rabbitmqadmin's declare, list and delete of users, vhosts and
    # permissions; lists sorted (sort=, sort_reverse=) and cut into columns
    # (columns=) by the API, as RabbitMQ 3.10.8 does it.
    try:
        for name, tags in (("adm-u1", "management"), ("adm-zu", "monitoring"),
                           ("adm-u2", "")):
            admin("declare", "user", "name=" + name, "password=pw-" + name, "tags=" + tags)
        admin("declare", "vhost", "name=adm-v2")
        admin("declare", "permission", "vhost=adm-v2", "user=adm-u1", "configure=^adm-",
              "write=.*", "read=.*")
        out = admin("list", "users", "name", "--sort=name", "--sort-reverse")[1]
        eq([r[0] for r in names_in(out, "adm-")], ["adm-zu", "adm-u2", "adm-u1"],
           "users sorted by name, descending")
        users = [u for u in admin_json("list", "users", "name", "tags")
                 if u["name"].startswith("adm-")]
        eq(users, [{"name": "adm-u1", "tags": ["management"]}, {"name": "adm-u2", "tags": []},
                   {"name": "adm-zu", "tags": ["monitoring"]}], "the columns asked, by name")
        eq(http_call("GET", "/api/users?page=1&page_size=1&columns=name")[1][:1],
           [{"name": "adm-u1"}], "users are not paged (as in RabbitMQ)")
        vhosts = admin_json("list", "vhosts", "name", "messages")
        eq([v for v in vhosts if v["name"] == "adm-v2"], [{"name": "adm-v2", "messages": 0}],
           "the vhost, its columns")
        eq([v["name"] for v in vhosts], sorted(v["name"] for v in vhosts), "vhosts by name")
        st, page = http_call("GET", "/api/vhosts?page=1&page_size=1&name=adm-v&columns=name")
        eq((st, page["items"], page["filtered_count"], page["page_count"]),
           (200, [{"name": "adm-v2"}], 1, 1), "a page of vhosts, filtered by name")
        eq(http_call("GET", "/api/vhosts?page=x")[1]["reason"],
           "Pagination parameters are invalid", "RabbitMQ's refusal")
        perms = [p for p in admin_json("list", "permissions", "user", "vhost", "configure")
                 if p["vhost"] == "adm-v2"]
        eq(sorted(perms, key=lambda p: p["user"]),
           [{"user": "adm-u1", "vhost": "adm-v2", "configure": "^adm-"},
            {"user": "guest", "vhost": "adm-v2", "configure": ".*"}],  # the creator's
           "permissions, their columns")
        eq([p["user"] for p in http_call("GET", "/api/vhosts/adm-v2/permissions?sort=user"
                                                "&sort_reverse=true&columns=user")[1]],
           ["guest", "adm-u1"], "a vhost's permissions sorted")
        eq(http_call("GET", "/api/users/adm-u1/permissions?columns=vhost,read")[1],
           [{"vhost": "adm-v2", "read": ".*"}], "a user's permissions, columns")
        amqp_login(qbroker().port, "adm-u1", "pw-adm-u1", "adm-v2", "adm-ok")
        admin("delete", "permission", "vhost=adm-v2", "user=adm-u1")
        eq(http_call("GET", "/api/permissions/adm-v2/adm-u1")[0], 404, "permission deleted")
        refused_vhost(qbroker().port, "adm-u1", "pw-adm-u1", "adm-v2")
        admin("delete", "user", "name=adm-zu")
        eq(http_call("GET", "/api/users/adm-zu")[0], 404, "user deleted")
        admin("delete", "vhost", "name=adm-v2")
        eq(names_in(admin("list", "vhosts")[1], "adm-v2"), [], "vhost deleted")
    finally:
        for path in ("/api/users/adm-u1", "/api/users/adm-u2", "/api/users/adm-zu",
                     "/api/vhosts/adm-v2"):
            http_call("DELETE", path)


def vhost_counts(name):
    """{API port: (messages, ready, unacknowledged)} of /api/vhosts/{name} on
    every broker, each the same in the list as alone (compared while they
    hold still: asked alone before and after the list, the same twice)."""
    b = qbroker()
    counts = {}
    keys = ("messages", "messages_ready", "messages_unacknowledged")

    def alone(port):
        st, v = http_call("GET", "/api/vhosts/" + urllib.parse.quote(name, safe=""), port=port)
        eq(st, 200, "vhost %s on port %d" % (name, port))
        return dict({k: v[k] for k in keys}, name=name)

    for port in [m.http_port for m in b.members] if b.cluster is not None else [b.http_port]:
        for _ in range(50):
            before = alone(port)
            listed_v = [x for x in http_call("GET", "/api/vhosts?columns=name," + ",".join(keys),
                                             port=port)[1] if x["name"] == name]
            if alone(port) == before:
                break
        eq(listed_v, [before], "listed the same")
        counts[port] = tuple(before[k] for k in keys)
    return counts


def vhost_counts_are(name, primaries, client):
    """One broker: its counts are primaries. A cluster, as its /api/overview
    counts (each broker what it holds): the brokers that are the queues'
    primaries (all but the client's, --queue-locator others) hold
    primaries between them; the client's broker holds client, what its
    stand-ins delivered to its clients and are not acknowledged yet."""
    b = qbroker()
    counts = vhost_counts(name)
    if b.cluster is None:
        return counts[b.http_port] == primaries
    held = tuple(sum(c[i] for port, c in counts.items() if port != b.http_port)
                 for i in range(3))
    return held == primaries and counts[b.http_port] == client


@test(timeout=120)
def vhost_message_counts_agree_with_amqp():
    eq(http_call("PUT", "/api/vhosts/adm-mv", "{}")[0], 201, "a vhost (guest may open it)")
    b = qbroker()
    ports = [m.http_port for m in b.members] if b.cluster is not None else [b.http_port]
    c = None
    try:
        # (In a cluster the other brokers learn the vhost from the map a
        # moment after the PUT's answer.)
        wait_until(lambda: all(http_call("GET", "/api/vhosts/adm-mv", port=p)[0] == 200
                               for p in ports), 10, what="every broker knowing the vhost")
        assert vhost_counts_are("adm-mv", (0, 0, 0), (0, 0, 0)), vhost_counts("adm-mv")
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", qbroker().port, "adm-mv", heartbeat=0))
        ch = c.channel()
        ch.confirm_delivery()
        for q in ("adm-m1", "adm-m2"):
            ch.queue_declare(q)
        for i in range(5):
            ch.basic_publish("", "adm-m1", b"m%d" % i)
        for i in range(3):
            ch.basic_publish("", "adm-m2", b"n%d" % i)
        got = [ch.basic_get("adm-m1", auto_ack=False) for _ in range(2)]
        assert all(g[0] is not None for g in got), got
        ready = sum(ch.queue_declare(q, passive=True).method.message_count
                    for q in ("adm-m1", "adm-m2"))
        eq(ready, 6, "AMQP: 6 ready (2 of 8 taken, not acknowledged)")
        wait_until(lambda: vhost_counts_are("adm-mv", (8, 6, 2), (2, 0, 2)), 15,
                   what="/api/vhosts' counts to agree with AMQP",
                   detail=lambda: vhost_counts("adm-mv"))
        ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
        wait_until(lambda: vhost_counts_are("adm-mv", (6, 6, 0), (0, 0, 0)), 15,
                   what="acknowledged", detail=lambda: vhost_counts("adm-mv"))
        if qbroker().cluster is None:
            eq(vhost_counts("/")[qbroker().http_port][0], sum(q["messages"] for q in http_call(
                "GET", "/api/queues/%2F?columns=messages")[1]), "/: its queues' sum")
    finally:
        if c is not None and c.is_open:
            c.close()
        http_call("DELETE", "/api/vhosts/adm-mv")


@test(timeout=60)
def bad_input_gets_rabbitmq_answers():
    eq(http_call("GET", "/api/nosuch"), (404, {"error": "Object Not Found",
                                               "reason": "Not Found"}), "unknown path")
    eq(http_call("GET", "/api/queues/%2F/nosuch")[0], 404, "missing queue")
    eq(http_call("GET", "/api/queues/nosuch-vhost")[0], 404, "missing vhost")
    st, body = http_call("PUT", "/api/queues/%2F/adm-bad", '{"durable": tru}')
    eq(st, 400, "malformed body")
    eq(body["error"], "bad_request", "error")
    assert "line 1, column 13" in body["reason"], body
    st, body = http_call("PUT", "/api/queues/%2F/adm-bad",
                         '{"arguments": {"x-max-length": "many"}}')
    eq(st, 400, "a refused argument")
    assert "x-max-length" in body["reason"], body
    assert not amqp_exists("adm-bad")
    st, body = http_call("PUT", "/api/exchanges/%2F/amq.mine", '{"type": "direct"}')
    eq((st, body["error"]), (401, "not_authorised"), "reserved prefix")
    # A body past 8 KiB is held only for an admitted request: a stranger's
    # head is answered before its body comes.
    sock = socket.create_connection(("127.0.0.1", qbroker().http_port), 5)
    sock.sendall(b"POST /api/definitions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Authorization: Basic Z3Vlc3Q6d3Jvbmc=\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 9000000\r\n\r\n")
    sock.settimeout(5)
    assert sock.recv(100).startswith(b"HTTP/1.1 401 "), "refused before the body"
    sock.close()
    # Pagination's refusals, each as RabbitMQ 3.10.8's to the same request.
    eq(http_call("GET", "/api/queues?page=0"),
       (400, {"error": "invalid_pagination_parameters",
              "reason": "Invalid pagination parameters: page number 0, page size undefined"}),
       "page 0")
    eq(http_call("GET", "/api/queues?page=1&page_size=501")[1]["error"],
       "invalid_pagination_parameters", "page size 501")
    eq(http_call("GET", "/api/queues?page=abc"),
       (400, {"error": "bad_request", "reason": "Pagination parameters are invalid"}), "abc")
    st, body = http_call("GET", "/api/queues?page=1&page_size=1")
    n = body["filtered_count"]
    for sort in ("", "&sort=messages"):   # cut by name first, or gathered whole
        eq(http_call("GET", "/api/queues?page=%d&page_size=1%s" % (n + 1, sort))[0], 200,
           "a page at the list's end is empty, not refused")
        eq(http_call("GET", "/api/queues?page=%d&page_size=1%s" % (n + 2, sort)),
           (400, {"error": "page_out_of_range", "reason": "Page out of range, page: %d page "
                  "size: 1, len: %d" % (n + 2, n)}), "past the end")
    # A sort by a field the items lack keeps the default order (vhost, name).
    names = [q["name"] for q in http_call("GET", "/api/queues?sort=nosuch&columns=name")[1]]
    eq(names, sorted(names), "ties in name order")
    st, body = http_call("GET", "/api/queues?page=1&page_size=1")
    eq((st, sorted(body)), (200, ["filtered_count", "item_count", "items", "page",
                                  "page_count", "page_size", "total_count"]), "a page")


@test(timeout=120)
def export_and_import_with_rabbitmqadmin():
    admin("declare", "exchange", "name=adm-ex", "type=fanout", "durable=true")
    admin("declare", "queue", "name=adm-eq", "durable=true", 'arguments={"x-message-ttl": 60000}')
    admin("declare", "binding", "source=adm-ex", "destination=adm-eq", "routing_key=k")
    d = tempfile.mkdtemp(prefix="quay-adm-")
    try:
        path = os.path.join(d, "defs.json")
        admin("export", path)
        defs = json.load(open(path))
        eq([q for q in defs["queues"] if q["name"] == "adm-eq"],
           [{"name": "adm-eq", "vhost": "/", "durable": True, "auto_delete": False,
             "arguments": {"x-message-ttl": 60000}}], "exported queue")
        assert {"name": "guest"}.items() <= defs["users"][0].items(), defs["users"]
        assert [b for b in defs["bindings"] if b["source"] == "adm-ex"], defs["bindings"]
        admin("delete", "queue", "name=adm-eq")
        admin("delete", "exchange", "name=adm-ex")
        # Padded past 8 KiB: the body goes to the heap as it arrives.
        defs["queues"] += [{"name": "adm-many-%03d" % i, "vhost": "/", "durable": False,
                            "auto_delete": False, "arguments": {}} for i in range(300)]
        json.dump(defs, open(path, "w"))
        assert os.path.getsize(path) > 2 * 8192, os.path.getsize(path)
        admin("import", path)
        eq(len([q for q in admin_json("list", "queues") if q["name"].startswith("adm-many-")]),
           300, "every queue of a big import")
        for i in range(300):
            http_call("DELETE", "/api/queues/%%2F/adm-many-%03d" % i)
        assert amqp_exists("adm-eq")
        bs = [b for b in admin_json("list", "bindings") if b["source"] == "adm-ex"]
        eq(len(bs), 1, "binding restored")
        # A user, a vhost and a permission imported by rabbitmqadmin (RabbitMQ
        # 3.10's hash of "pw2") log in over AMQP.
        user_path = os.path.join(d, "user.json")
        json.dump({"users": [{"name": "adm-user", "tags": "",
                              "password_hash": "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND",
                              "hashing_algorithm": "rabbit_password_hashing_sha256"}],
                   "vhosts": [{"name": "adm-v"}],
                   "permissions": [{"user": "adm-user", "vhost": "adm-v", "configure": "^adm-",
                                    "write": ".*", "read": ".*"}]}, open(user_path, "w"))
        admin("import", user_path)
        wait_until(lambda: http_call("GET", "/api/permissions/adm-v/adm-user")[0] == 200, 10,
                   what="the imported permission")
        amqp_login(qbroker().port, "adm-user", "pw2", "adm-v", "adm-ok")
        http_call("DELETE", "/api/users/adm-user")
        http_call("DELETE", "/api/vhosts/adm-v")
        # Nothing of a refused import is applied.
        bad = dict(defs, queues=defs["queues"] + [{"name": "adm-never", "vhost": "/",
                                                  "durable": True, "auto_delete": False,
                                                  "arguments": {}}],
                   bindings=[{"source": "adm-ex", "vhost": "/", "destination": "nowhere",
                              "destination_type": "queue", "routing_key": "", "arguments": {}}])
        st, body = http_call("POST", "/api/definitions", json.dumps(bad))
        eq(st, 400, "a binding to nowhere")
        assert "nowhere" in body["reason"], body
        assert not amqp_exists("adm-never")
        st, body = http_call("POST", "/api/definitions", '{"queues": [}')
        eq(st, 400, "malformed")
        assert "column 13" in body["reason"], body
        other = dict(defs, users=[{"name": "mallory", "password_hash": "x", "tags": []}])
        st, body = http_call("POST", "/api/definitions", json.dumps(other))
        eq(st, 400, "an unknown user")
        assert "mallory" in body["reason"], body
    finally:
        shutil.rmtree(d, ignore_errors=True)
        admin("delete", "queue", "name=adm-eq", check=False)
        admin("delete", "exchange", "name=adm-ex", check=False)


def _gone(kind, path):
    eq(http_call("GET", path)[0], 404, "nothing of a refused import: %s" % kind)


@test(timeout=120)
def a_refused_import_applies_nothing_and_names_the_item():
    """A refusal of any item leaves the broker as it was: no user, vhost,
    policy, limit, exchange or queue of the file, earlier items included;
    the reason names the item ("queues[1]: ...")."""
    base = {"users": [{"name": "ri-user", "password_hash": "", "tags": []}],
            "vhosts": [{"name": "ri-v"}],
            "permissions": [{"user": "ri-user", "vhost": "ri-v", "configure": ".*",
                             "write": ".*", "read": ".*"}],
            "exchanges": [{"name": "ri-x", "vhost": "/", "type": "fanout", "durable": True,
                           "auto_delete": False, "internal": False, "arguments": {}}],
            "queues": [{"name": "ri-ok1", "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {}},
                       {"name": "ri-bad", "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {"x-max-length": "many"}}]}
    st, body = http_call("POST", "/api/definitions", json.dumps(base))
    eq((st, body["error"]), (400, "bad_request"), "a bad queue argument: %r" % body)
    assert body["reason"].startswith("queues[1]: ") and "x-max-length" in body["reason"], body
    assert not amqp_exists("ri-ok1")
    base.update(parameters=[{"vhost": "ri-v", "component": "vhost-limits", "name": "limits",
                             "value": {"max-queues": 10}}],
                policies=[{"vhost": "/", "name": "ri-pol", "pattern": "^ri-",
                           "definition": {"ha-mode": "exactly", "ha-params": 2},
                           "priority": 0, "apply-to": "queues"}])
    bad_policy = dict(base, queues=base["queues"][:1],
                      policies=base["policies"] + [{"vhost": "/", "name": "ri-pol2",
                                                    "pattern": "x", "definition":
                                                    {"max-length": 5}}])
    st, body = http_call("POST", "/api/definitions", json.dumps(bad_policy))
    eq(st, 400, "a policy quay cannot apply: %r" % body)
    assert body["reason"].startswith("policies[1]: ") and "max-length" in body["reason"], body
    # An existing queue declared otherwise (as a passive declare judges it).
    admin("declare", "queue", "name=ri-there", "durable=true",
          'arguments={"x-message-ttl": 1000}')
    other = dict(base, queues=base["queues"][:1] + [
        {"name": "ri-there", "vhost": "/", "durable": True, "auto_delete": False,
         "arguments": {"x-message-ttl": 2000}}])
    st, body = http_call("POST", "/api/definitions", json.dumps(other))
    eq(st, 400, "inequivalent: %r" % body)
    assert body["reason"].startswith("queues[1]: inequivalent arg 'x-message-ttl'"), body
    admin("delete", "queue", "name=ri-there")
    # A binding from a missing exchange: refused, naming it (RabbitMQ 3.10.8,
    # tried by hand, answers 204 and leaves the binding out).
    nowhere = dict(base, queues=base["queues"][:1], bindings=[
        {"source": "ri-nosuch", "vhost": "/", "destination": "ri-ok1",
         "destination_type": "queue", "routing_key": "", "arguments": {}}])
    st, body = http_call("POST", "/api/definitions", json.dumps(nowhere))
    eq(st, 400, "a binding from nowhere")
    assert body["reason"].startswith("bindings[0]: "), body
    # Refused only once applying started (the file's own queue limit, which
    # the broker's queue.declare enforces): what was applied is taken back.
    limited = dict(base, parameters=[dict(base["parameters"][0], value={"max-queues": 1})],
                   permissions=base["permissions"] + [
                       {"user": "guest", "vhost": "ri-v", "configure": ".*", "write": ".*",
                        "read": ".*"}],
                   queues=[{"name": "ri-q%d" % i, "vhost": "ri-v", "durable": True,
                            "auto_delete": False, "arguments": {}} for i in (1, 2)])
    st, body = http_call("POST", "/api/definitions", json.dumps(limited))
    eq((st, body), (400, {"error": "bad_request", "reason": "queues[1]: cannot declare queue "
                          "'ri-q2': queue limit in vhost 'ri-v' (1) is reached"}),
       "refused part way")
    _gone("user", "/api/users/ri-user")
    _gone("vhost", "/api/vhosts/ri-v")
    _gone("policy", "/api/policies/%2F/ri-pol")
    _gone("exchange", "/api/exchanges/%2F/ri-x")
    assert not amqp_exists("ri-ok1")


@test(timeout=120)
def an_export_with_policies_and_limits_imports():
    """quay's export with a policy and vhost and user limits imports into a
    broker without them (the vhost and user deleted first: a fresh one for
    them), and POST /api/definitions/{vhost} imports one vhost's."""
    eq([http_call("PUT", "/api/vhosts/pl-v", "{}")[0],
        http_call("PUT", "/api/users/pl-user", json.dumps({"password": "pw", "tags": ""}))[0],
        http_call("PUT", "/api/permissions/pl-v/guest", json.dumps(
            {"configure": ".*", "write": ".*", "read": ".*"}))[0] // 100 * 100 + 1,
        http_call("PUT", "/api/policies/pl-v/pl-pol", json.dumps(
            {"pattern": "^pl-", "definition": {"ha-mode": "exactly", "ha-params": 2},
             "priority": 3}))[0],
        http_call("PUT", "/api/vhost-limits/pl-v/max-queues", '{"value": 7}')[0],
        http_call("PUT", "/api/user-limits/pl-user/max-channels", '{"value": 4}')[0]],
       [201, 201, 201, 201, 204, 204], "pl-v's settings")
    st, defs = http_call("GET", "/api/definitions")
    eq(st, 200, "export")
    http_call("DELETE", "/api/users/pl-user")
    http_call("DELETE", "/api/vhosts/pl-v")
    _gone("policy", "/api/policies/pl-v/pl-pol")
    try:
        st, body = http_call("POST", "/api/definitions", json.dumps(defs))
        eq(st, 204, "quay imports its own export with a policy and limits: %r" % (body,))
        p = http_call("GET", "/api/policies/pl-v/pl-pol")[1]
        eq((p["pattern"], p["priority"], p["backups"]), ("^pl-", 3, 1), "the imported policy")
        eq(http_call("GET", "/api/vhost-limits/pl-v")[1],
           [{"vhost": "pl-v", "value": {"max-queues": 7}}], "the imported vhost limits")
        eq(http_call("GET", "/api/user-limits/pl-user")[1],
           [{"user": "pl-user", "value": {"max-channels": 4}}], "the imported user limits")
        # One vhost's: no vhost fields; a policy changed, a queue added.
        one = {"policies": [{"name": "pl-pol", "pattern": "^pl-", "priority": 1,
                             "definition": {"ha-mode": "exactly", "ha-params": 1}}],
               "queues": [{"name": "pl-q", "durable": True, "auto_delete": False,
                           "arguments": {}}]}
        st, body = http_call("POST", "/api/definitions/pl-v", json.dumps(one))
        eq(st, 204, "a vhost's import: %r" % (body,))
        p = http_call("GET", "/api/policies/pl-v/pl-pol")[1]
        eq((p["priority"], p["backups"]), (1, 0), "the changed policy")
        eq(http_call("GET", "/api/queues/pl-v/pl-q")[0], 200, "pl-q in pl-v")
    finally:
        http_call("DELETE", "/api/users/pl-user")
        http_call("DELETE", "/api/vhosts/pl-v")


# ---- quayctl's rabbitmqctl verbs ----------------------------------------------------

QUAYCTL = os.path.join(os.path.dirname(os.environ.get("QUAYD", "")), "quayctl")


def quayctl(*args, port=None):
    p = subprocess.run([QUAYCTL, "--http", "127.0.0.1:%d" % (port or qbroker().http_port)] +
                       list(args), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


@test(timeout=120)
def quayctl_lists_definitions_and_probes():
    admin("declare", "queue", "name=ctl-q")
    for _ in range(2):
        admin("publish", "routing_key=ctl-q", "payload=x")
    rc, out, err = quayctl("list-queues")
    eq(rc, 0, err)
    head = out.split("\n")[0].split()
    eq(head, ["name", "messages_ready", "messages_unacknowledged", "consumers"], "columns")
    row = [line.split() for line in out.split("\n") if line.startswith("ctl-q ")]
    eq(row, [["ctl-q", "2", "0", "0"]], "the queue's row agrees with AMQP %r" %
       (amqp_counts("ctl-q"),))
    rc, out, err = quayctl("--json", "list-queues", "name", "durable")
    eq(rc, 0, err)
    mine = [q for q in json.loads(out) if q["name"] == "ctl-q"]
    eq(mine, [{"name": "ctl-q", "durable": True}], "--json with columns")
    rc, out, _ = quayctl("list-bindings")
    assert any(line.split()[:3] == ["queue", "ctl-q", "ctl-q"] for line in out.split("\n")), out
    rc, out, _ = quayctl("cluster-status")
    eq(len(out.strip().split("\n")) - 1, 1 if qbroker().cluster is None else 3, out)
    d = tempfile.mkdtemp(prefix="quay-ctl-")
    try:
        path = os.path.join(d, "defs.json")
        eq(quayctl("export-definitions", path)[0], 0, "export")
        assert any(q["name"] == "ctl-q" for q in json.load(open(path))["queues"])
        admin("delete", "queue", "name=ctl-q")
        rc, _, err = quayctl("import-definitions", path)
        eq(rc, 0, err)
        assert amqp_exists("ctl-q")
        open(path, "w").write('{"queues": [\n  {"name": }]}')
        rc, _, err = quayctl("import-definitions", path)
        eq(rc, 76, "a refused file")
        assert "line 2, column 12" in err, err
        eq(quayctl("import-definitions", os.path.join(d, "none"))[0], 65, "no such file")
        eq(quayctl("export-definitions", os.path.join(d, "no", "dir"))[0], 65, "unwritable")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    eq(quayctl("ping")[:2], (0, "Ping succeeded\n"), "ping")
    eq(quayctl("await-startup")[0], 0, "await-startup")
    closed = free_port()
    eq(quayctl("ping", port=closed)[0], 69, "ping of nothing")
    t0 = time.time()
    p = subprocess.run([QUAYCTL, "--http", "127.0.0.1:%d" % closed, "--timeout", "2",
                        "await-startup"], capture_output=True, text=True, timeout=30)
    eq(p.returncode, 69, "await-startup of nothing")
    assert 1.5 < time.time() - t0 < 10, time.time() - t0
    admin("delete", "queue", "name=ctl-q")


@test(timeout=120)
def quayctl_lists_channels_and_consumers():
    """list-channels and list-consumers as rabbitmqctl's: their default
    columns, a consumer's queue and channel by the nested fields' dotted
    paths, and the rows agree with what the client set up."""
    c = amqp()
    try:
        ch = c.channel()
        ch.queue_declare("ctl-cq")
        ch.basic_qos(prefetch_count=3)
        ch.basic_consume("ctl-cq", lambda *a: None, consumer_tag="ctl-tag")
        rc, out, err = quayctl("list-consumers")
        eq(rc, 0, err)
        lines = out.split("\n")
        eq(lines[0].split(), ["queue.name", "channel_details.name", "consumer_tag",
                              "ack_required", "prefetch_count", "active"], "columns")
        row = [line.split() for line in lines if line.startswith("ctl-cq ")]
        eq(len(row), 1, out)
        eq((row[0][0], row[0][-4:]), ("ctl-cq", ["ctl-tag", "yes", "3", "yes"]), out)
        channel = " ".join(row[0][1:-4])  # "host:port -> host:port (1)"
        rc, out, err = quayctl("list-channels")
        eq(rc, 0, err)
        eq(out.split("\n")[0].split(), ["name", "user", "consumer_count",
                                        "messages_unacknowledged"], "columns")
        mine = [line for line in out.split("\n") if line.startswith(channel + " ")]
        eq(len(mine), 1, "the consumer's channel %r in %r" % (channel, out))
        eq(mine[0][len(channel):].split(), ["guest", "1", "0"], out)
        rc, out, err = quayctl("--json", "list-consumers", "consumer_tag", "queue.name")
        eq(rc, 0, err)
        eq([x for x in json.loads(out) if x["consumer_tag"] == "ctl-tag"],
           [{"consumer_tag": "ctl-tag", "queue": {"name": "ctl-cq"}}], "--json")
        ch.queue_delete("ctl-cq")
    finally:
        c.close()


# ---- quayd --definitions ---------------------------------------------------------

@test(timeout=120)
def quayd_loads_definitions_at_start():
    """A fresh quayd (one, in either mode: this is about its start) applies a
    definitions file as RabbitMQ's load_definitions, and refuses to start
    on a file it would refuse over HTTP."""
    d = tempfile.mkdtemp(prefix="quay-defs-")
    procs = []
    try:
        good = {"exchanges": [{"name": "boot-x", "vhost": "/", "type": "topic", "durable": True,
                               "auto_delete": False, "internal": False, "arguments": {}}],
                "queues": [{"name": "boot-q", "vhost": "/", "durable": True,
                            "auto_delete": False, "arguments": {"x-max-length": 5}}],
                "bindings": [{"source": "boot-x", "vhost": "/", "destination": "boot-q",
                              "destination_type": "queue", "routing_key": "k.*",
                              "arguments": {}}],
                # RabbitMQ 3.10's hash of "pw2" (35-users), in a vhost of its own
                "users": [{"name": "boot-user", "tags": ["management"],
                           "password_hash": "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND",
                           "hashing_algorithm": "rabbit_password_hashing_sha256"}],
                "vhosts": [{"name": "boot-v"}],
                "permissions": [{"user": "boot-user", "vhost": "boot-v", "configure": ".*",
                                 "write": ".*", "read": ".*"}]}
        good["queues"].append({"name": "boot-vq", "vhost": "boot-v", "durable": True,
                               "auto_delete": False, "arguments": {}})
        path = os.path.join(d, "good.json")
        json.dump(good, open(path, "w"))
        port = free_port()
        log = open(os.path.join(d, "quayd.log"), "w")
        p = subprocess.Popen([os.environ["QUAYD"], "--listen", "127.0.0.1:%d" % port,
                              "--data", os.path.join(d, "data"), "--definitions", path],
                             stdout=log, stderr=log)
        procs.append(p)

        def declared():
            try:
                c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
            except Exception:
                return False
            try:
                ch = c.channel()
                ch.queue_declare("boot-q", passive=True)
                ch.basic_publish("boot-x", "k.a", b"routed")
                return ch.queue_declare("boot-q", passive=True).method.message_count == 1
            except pika.exceptions.ChannelClosedByBroker:
                return False
            finally:
                if c.is_open:
                    c.close()
        wait_until(declared, 20, 0.2, what="the definitions applied at start")
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, "boot-v", pika.PlainCredentials("boot-user", "pw2")))
        c.channel().queue_declare("boot-vq", passive=True)
        c.close()
        p.send_signal(signal.SIGTERM)
        eq(p.wait(10), 0, "clean stop")
        log.close()
        text = open(os.path.join(d, "quayd.log")).read()
        assert "definitions from %s applied: 4" % path in text, text
        assert "quay-internal" not in json.dumps(good)
        bad = os.path.join(d, "bad.json")
        open(bad, "w").write('{"queues": [{"name": "x", "vhost": "/nope"}]}')
        p = subprocess.run([os.environ["QUAYD"], "--listen", "127.0.0.1:%d" % free_port(),
                            "--data", os.path.join(d, "data2"), "--definitions", bad],
                           capture_output=True, text=True, timeout=30)
        eq(p.returncode, 1, "a refused file stops the start")
        assert "queues[0]: vhost '/nope' neither exists nor is in the definitions" in \
            p.stderr, p.stderr
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)


@test(timeout=180)
def quayd_loads_definitions_with_users_in_a_cluster():
    """Three brokers started with the same definitions file (users, a vhost,
    a permission, a queue): each applies it (users.import: the map's users,
    vhosts and permissions), the users file still seeds the map (guest is
    kept: an import does not take users.bootstrap's place), and the
    imported user logs in on any broker."""
    if not CLUSTERED:
        print("# a cluster's: QUAY_TEST_MODE=cluster")
        return
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "cluster"))
    import clustertest
    d = tempfile.mkdtemp(prefix="quay-defs-")
    path = os.path.join(d, "defs.json")
    json.dump({"users": [{"name": "boot-user", "tags": ["management"],
                          "password_hash": "rtC4mNXASyrZf6MgmEmXB1uQj829H8uHd0xcwDodPWrc9RND",
                          "hashing_algorithm": "rabbit_password_hashing_sha256"}],
               "vhosts": [{"name": "boot-v"}],
               "permissions": [{"user": "boot-user", "vhost": "boot-v", "configure": ".*",
                                "write": ".*", "read": ".*"}],
               "queues": [{"name": "boot-vq", "vhost": "boot-v", "durable": True,
                           "auto_delete": False, "arguments": {}}]}, open(path, "w"))
    cluster = clustertest.Cluster()
    try:
        members = cluster.form(["a", "b", "c"], extra_args=["--definitions", path])

        def logs_in(m):
            try:
                c = pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", m.amqp_port, "boot-v", pika.PlainCredentials("boot-user", "pw2"),
                    connection_attempts=1))
            except pika.exceptions.AMQPError:
                return False
            c.channel().queue_declare("boot-vq", passive=True)
            c.close()
            return True
        for m in members:
            wait_until(lambda: logs_in(m), 30, 0.5, what="boot-user on %s" % m.name)
            eq(sorted(u["name"] for u in m.api_get("/api/users")), ["boot-user", "guest"],
               "the users on %s" % m.name)
    finally:
        cluster.close()
        shutil.rmtree(d, ignore_errors=True)

# ---- RabbitMQ 3.10, by hand -------------------------------------------------------

class Rabbit:
    """One RabbitMQ node with the management plugin, private dirs and ports."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="quay-rmq-")
        self.amqp_port, self.http_port = free_port(), free_port()
        self.dist_port, self.epmd_port = free_port(), free_port()
        self.name = "quaytest%d@localhost" % os.getpid()
        with open(os.path.join(self.dir, "rabbitmq.conf"), "w") as f:
            f.write("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n"
                    "management.tcp.port = %d\nmanagement.tcp.ip = 127.0.0.1\n"
                    "disk_free_limit.absolute = 10MB\nlog.console = false\n"
                    "log.file.level = warning\n" % (self.amqp_port, self.http_port))
        open(os.path.join(self.dir, "enabled_plugins"), "w").write("[rabbitmq_management].\n")
        open(os.path.join(self.dir, "advanced.config"), "w").write("[].\n")
        os.makedirs(os.path.join(self.dir, "home"))
        self.env = dict(os.environ, HOME=os.path.join(self.dir, "home"),
                        ERL_EPMD_PORT=str(self.epmd_port), ERL_EPMD_ADDRESS="127.0.0.1",
                        RABBITMQ_NODENAME=self.name, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                        RABBITMQ_NODE_PORT=str(self.amqp_port),
                        RABBITMQ_DIST_PORT=str(self.dist_port),
                        RABBITMQ_MNESIA_BASE=os.path.join(self.dir, "mnesia"),
                        RABBITMQ_LOG_BASE=os.path.join(self.dir, "log"),
                        RABBITMQ_CONFIG_FILE=os.path.join(self.dir, "rabbitmq"),
                        RABBITMQ_ADVANCED_CONFIG_FILE=os.path.join(self.dir, "advanced.config"),
                        RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(self.dir, "enabled_plugins"),
                        RABBITMQ_PLUGINS_EXPAND_DIR=os.path.join(self.dir, "plugins"),
                        RABBITMQ_CONF_ENV_FILE="/nonexistent",
                        RABBITMQ_CTL_DIST_PORT_MIN=str(self.dist_port + 1),
                        RABBITMQ_CTL_DIST_PORT_MAX=str(self.dist_port + 1))
        self.proc = subprocess.Popen([RMQ_HOME + "/sbin/rabbitmq-server"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def wait(self):
        def up():
            try:
                return self.call("GET", "/api/overview")[0] == 200
            except OSError:
                return False
        try:
            wait_until(up, 150, 0.5, what="RabbitMQ's management API")
        except AssertionError:
            logs = glob.glob(os.path.join(self.dir, "log", "*.log"))
            tail = "".join(open(f, errors="replace").read()[-2000:] for f in logs)
            raise AssertionError("RabbitMQ did not start (exit %r): %s" %
                                 (self.proc.poll(), tail or "no log"))

    def call(self, method, path, body=None):
        return http_call(method, path, body, port=self.http_port)

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait(10)
        # What the node left running outside its process group, its epmd
        # above all (a daemon): the processes whose environment has our own
        # HOME, by id.
        home = ("HOME=" + self.env["HOME"]).encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if home in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


RABBIT_FIELDS = ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "type",
                 "state", "messages", "messages_ready", "messages_unacknowledged", "consumers")


def not_guest(defs):
    """Definitions without guest's user and permissions."""
    defs["users"] = [u for u in defs["users"] if u["name"] != "guest"]
    defs["permissions"] = [p for p in defs["permissions"] if p["user"] != "guest"]


def amqp_login(port, user, password, vhost, queue):
    """Logs in over AMQP and declares a queue its permission allows."""
    c = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password),
        connection_attempts=1))
    try:
        c.channel().queue_declare(queue)
        try:
            c.channel().queue_declare("not-" + queue)
            raise AssertionError("a declare outside the configure regex passed")
        except pika.exceptions.ChannelClosedByBroker as e:
            # RabbitMQ 3.10.8 says "access to queue ..." here, quay "configure
            # access to queue ...": the code and the rest agree.
            eq(e.reply_code, 403)
            assert e.reply_text.startswith("ACCESS_REFUSED - ") and e.reply_text.endswith(
                "access to queue 'not-%s' in vhost '%s' refused for user '%s'"
                % (queue, vhost, user)), e.reply_text
    finally:
        if c.is_open:
            c.close()


def refused_vhost(port, user, password, vhost):
    try:
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, vhost, pika.PlainCredentials(user, password),
            connection_attempts=1)).close()
        raise AssertionError("%s opened vhost %s without a permission" % (user, vhost))
    except pika.exceptions.ProbableAccessDeniedError:
        pass


@test(timeout=280)
def definitions_round_trip_with_rabbitmq():
    if not os.path.exists(RMQ_HOME + "/sbin/rabbitmq-server"):
        print("# skipped: rabbitmq-server is not installed (scripts/setup.sh installs it)")
        return
    rmq = Rabbit()
    try:
        # quay -> RabbitMQ: objects made through rabbitmqadmin on quay.
        admin("declare", "exchange", "name=rt-x", "type=headers")
        admin("declare", "queue", "name=rt-q", "durable=true",
              'arguments={"x-max-length": 10, "x-overflow": "reject-publish"}')
        admin("declare", "binding", "source=rt-x", "destination=rt-q",
              'arguments={"x-match": "any", "k": "v"}')
        for i in range(3):
            admin("publish", "routing_key=rt-q", "payload=%d" % i)
        # A user made on quay (sha256, quay's default form) with a vhost.
        eq([http_call("PUT", "/api/vhosts/rt-v", "{}")[0],
            http_call("PUT", "/api/users/rt-user", json.dumps({"password": "rt-pw",
                                                               "tags": "management"}))[0],
            http_call("PUT", "/api/permissions/rt-v/rt-user", json.dumps(
                {"configure": "^rt-", "write": ".*", "read": ".*"}))[0]], [201, 201, 201],
           "rt-user on quay")
        eq(http_call("PUT", "/api/policies/%2F/rt-pol", json.dumps(
            {"pattern": "^rt-", "definition": {"ha-mode": "exactly", "ha-params": 2},
             "priority": 1, "apply-to": "queues"}))[0], 201, "a policy on quay")
        rmq.wait()
        st, defs = http_call("GET", "/api/definitions")
        eq(st, 200, "quay export")
        not_guest(defs)   # RabbitMQ's guest stays as it is
        eq(rmq.call("POST", "/api/definitions", json.dumps(defs))[0], 204,
           "RabbitMQ imports quay's export")
        st, pol = rmq.call("GET", "/api/policies/%2F/rt-pol")
        eq((st, pol["definition"], pol["priority"]),
           (200, {"ha-mode": "exactly", "ha-params": 2}, 1), "quay's policy in RabbitMQ")
        rabbit_user = rmq.call("GET", "/api/users/rt-user")[1]
        eq((rabbit_user["hashing_algorithm"], rabbit_user["tags"]),
           ("rabbit_password_hashing_sha256", ["management"]), "quay's user in RabbitMQ")
        # RabbitMQ starts an imported vhost's processes after it answered.
        wait_until(lambda: rmq.call("GET", "/api/aliveness-test/rt-v")[0] == 200, 20, 0.5,
                   what="rt-v running in RabbitMQ")
        amqp_login(rmq.amqp_port, "rt-user", "rt-pw", "rt-v", "rt-ok")
        refused_vhost(rmq.amqp_port, "rt-user", "rt-pw", "/")
        st, q = rmq.call("GET", "/api/queues/%2F/rt-q")
        eq((st, q["arguments"], q["durable"]), (200, {"x-max-length": 10,
                                                      "x-overflow": "reject-publish"}, True),
           "the queue in RabbitMQ")
        st, bs = rmq.call("GET", "/api/bindings/%2F/e/rt-x/q/rt-q")
        eq([b["arguments"] for b in bs], [{"x-match": "any", "k": "v"}], "the binding there")
        # The same queue, with the same messages, field by field.
        ok = rmq.call("POST", "/api/exchanges/%2F/amq.default/publish", json.dumps(
            {"routing_key": "rt-q", "payload": "x", "payload_encoding": "string",
             "properties": {}}))
        eq(ok, (200, {"routed": True}), "publish in RabbitMQ")
        for i in range(2):
            rmq.call("POST", "/api/exchanges/%2F/amq.default/publish", json.dumps(
                {"routing_key": "rt-q", "payload": "y", "payload_encoding": "string",
                 "properties": {}}))
        wait_until(lambda: rmq.call("GET", "/api/queues/%2F/rt-q")[1].get("messages") == 3,
                   20, 0.5, what="RabbitMQ's counts (emitted every 5 s)")
        theirs = rmq.call("GET", "/api/queues/%2F/rt-q")[1]
        ours = http_call("GET", "/api/queues/%2F/rt-q")[1]
        for k in RABBIT_FIELDS:
            eq(ours[k], theirs[k], "field %s, quay vs RabbitMQ" % k)
        # The exchange and the binding, field by field too (a binding with
        # arguments has another properties_key: each broker hashes its own).
        theirs = rmq.call("GET", "/api/exchanges/%2F/rt-x")[1]
        ours = http_call("GET", "/api/exchanges/%2F/rt-x")[1]
        for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"):
            eq(ours[k], theirs[k], "exchange field %s, quay vs RabbitMQ" % k)
        theirs = rmq.call("GET", "/api/bindings/%2F/e/rt-x/q/rt-q")[1]
        ours = http_call("GET", "/api/bindings/%2F/e/rt-x/q/rt-q")[1]
        eq([{k: v for k, v in b.items() if k != "properties_key"} for b in ours],
           [{k: v for k, v in b.items() if k != "properties_key"} for b in theirs],
           "bindings, quay vs RabbitMQ")
        ours = http_call("GET", "/api/queues/%2F/rt-q/bindings")[1]
        theirs_q = rmq.call("GET", "/api/queues/%2F/rt-q/bindings")[1]
        eq([(b["source"], b["routing_key"], b["properties_key"]) for b in ours
            if not b["arguments"]],
           [(b["source"], b["routing_key"], b["properties_key"]) for b in theirs_q
            if not b["arguments"]], "a queue's default binding, quay vs RabbitMQ")
        # RabbitMQ -> quay: its export, with its own fields, imports here.
        rmq.call("PUT", "/api/queues/%2F/rt-from-rabbit", json.dumps(
            {"durable": True, "arguments": {"x-queue-mode": "lazy"}}))
        rmq.call("PUT", "/api/exchanges/%2F/rt-rx", json.dumps({"type": "fanout"}))
        rmq.call("POST", "/api/bindings/%2F/e/rt-rx/q/rt-from-rabbit",
                 json.dumps({"routing_key": "r"}))
        # A user made on RabbitMQ, with a vhost of its own and a permission.
        rmq.call("PUT", "/api/vhosts/rt-rv")
        rmq.call("PUT", "/api/users/rt-ruser", json.dumps({"password": "rr-pw",
                                                           "tags": "monitoring"}))
        rmq.call("PUT", "/api/permissions/rt-rv/rt-ruser", json.dumps(
            {"configure": "^rt-", "write": ".*", "read": ".*"}))
        # A classic mirroring policy made on RabbitMQ (all: as many backups as
        # a quay queue may have).
        eq(rmq.call("PUT", "/api/policies/%2F/rt-rpol", json.dumps(
            {"pattern": "^rt-from", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"},
             "priority": 2, "apply-to": "queues"}))[0], 201, "a policy on RabbitMQ")
        st, theirs = rmq.call("GET", "/api/definitions")
        eq(st, 200, "RabbitMQ export")
        not_guest(theirs)     # their guest is an administrator from anywhere
        st, body = http_call("POST", "/api/definitions", json.dumps(theirs))
        eq(st, 204, "quay imports RabbitMQ's export: %r" % (body,))
        st, pol = http_call("GET", "/api/policies/%2F/rt-rpol")
        eq((st, pol["pattern"], pol["priority"], pol["backups"]), (200, "^rt-from", 2, 3),
           "RabbitMQ's policy in quay")
        st, ruser = http_call("GET", "/api/users/rt-ruser")
        eq((st, ruser["tags"]), (200, ["monitoring"]), "RabbitMQ's user in quay")
        amqp_login(qbroker().port, "rt-ruser", "rr-pw", "rt-rv", "rt-ok")
        refused_vhost(qbroker().port, "rt-ruser", "rr-pw", "/")
        # And back: the same user, its hash unchanged, imports into RabbitMQ.
        st, ours = http_call("GET", "/api/definitions")
        eq([u["password_hash"] for u in ours["users"] if u["name"] == "rt-ruser"],
           [u["password_hash"] for u in theirs["users"] if u["name"] == "rt-ruser"],
           "the hash RabbitMQ wrote, exported by quay")
        q = listed("rt-from-rabbit")
        eq((q["durable"], q["arguments"]), (True, {"x-queue-mode": "lazy"}), "imported queue")
        assert any(b["source"] == "rt-rx" and b["routing_key"] == "r"
                   for b in admin_json("list", "bindings")), "imported binding"
    finally:
        rmq.stop()
        for path in ("/api/users/rt-user", "/api/users/rt-ruser", "/api/vhosts/rt-v",
                     "/api/vhosts/rt-rv", "/api/policies/%2F/rt-pol", "/api/policies/%2F/rt-rpol"):
            http_call("DELETE", path)
        for q in ("rt-q", "rt-from-rabbit"):
            admin("delete", "queue", "name=" + q, check=False)
        for x in ("rt-x", "rt-rx"):
            admin("delete", "exchange", "name=" + x, check=False)


if __name__ == "__main__":
    qbroker()
    run()
