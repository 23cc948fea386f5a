"""Goal: replication policies decide a queue's backups cluster-wide, by queue
name, without touching the queue: a policy put through one broker's HTTP API
places queues declared through another with its backups; a queue's own
x-quay-backups still wins; changing or deleting the policy changes the
backups of existing queues (the leader's controller decides, the primary
catches new backups up); bad input is refused with the right status.

Method: three quayd processes (tests/cluster/clustertest.py) with the
default --default-backups 1; HTTP PUT/DELETE on broker a, AMQP declares on
broker b, /api/queues read on every broker; quayctl on broker c.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, api_call, closer, free_port, queue_info, quayd_path,  # noqa: E402
                         run, test, wait_until)

import pika  # noqa: E402

cluster = None
members = {}


def connect(member):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", member.amqp_port, heartbeat=0, blocked_connection_timeout=30))


def http(member, method, path, body=None):
    """(status, parsed JSON body) of one request, logged in as the harness's
    API user (clustertest.api_call)."""
    return api_call("127.0.0.1", member.http_port, method, path, body, timeout=15)


def everywhere(name, pred):
    """pred holds for the queue's entry on every broker."""
    infos = [queue_info(m, name) for m in members.values()]
    return all(i is not None and pred(i) for i in infos)


def backups_are(name, n):
    return lambda: everywhere(name, lambda i: len(i["backups"]) == n and
                              i["replication_factor"] == n + 1)


@test(timeout=120)
def three_brokers():
    global cluster
    cluster = Cluster()
    for m in cluster.form(["a", "b", "c"]):
        members[m.name] = m


@test(timeout=60)
def a_policy_put_on_one_broker_places_queues_declared_on_another():
    a, b = members["a"], members["b"]
    status, body = http(a, "PUT", "/api/policies/%2F/ha",
                        {"pattern": "^ha\\.", "priority": 0, "backups": 2})
    assert (status, body) == (201, None), (status, body)  # RabbitMQ's: no body
    status, body = http(a, "GET", "/api/policies/%2F/ha")
    assert body["backups"] == 2 and body["pattern"] == "^ha\\.", body
    # Every broker has it (the map is the same everywhere).
    wait_until(lambda: all(http(m, "GET", "/api/policies")[1] == [body]
                           for m in members.values()), 10, what="the policy everywhere")
    c = connect(b)
    ch = c.channel()
    ch.queue_declare("ha.x", durable=True)
    ch.queue_declare("plain", durable=True)
    ch.queue_declare("ha.own", durable=True, arguments={"x-quay-backups": 0})
    c.close()
    info = queue_info(b, "ha.x")
    assert len(info["backups"]) == 2 and info["policy"] == "ha", info
    assert info["replication_factor"] == 3, info
    assert info["primary"] not in info["backups"], info
    info = queue_info(b, "plain")
    assert len(info["backups"]) == 1 and info["policy"] is None, info  # the default
    info = queue_info(b, "ha.own")
    assert info["backups"] == [] and info["policy"] is None, info  # its own argument wins
    wait_until(backups_are("ha.x", 2), 10, what="ha.x with 2 backups everywhere")


@test(timeout=90)
def changing_the_policy_changes_existing_queues():
    a, b = members["a"], members["b"]
    c = connect(b)
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", "ha.x", b"m%d" % i,
                         pika.BasicProperties(delivery_mode=2))
    c.close()
    status, body = http(a, "PUT", "/api/policies/%2F/ha",
                        {"pattern": "^ha\\.", "priority": 0, "backups": 0})
    assert (status, body) == (204, None), (status, body)  # replaced
    wait_until(backups_are("ha.x", 0), 15, what="ha.x down to 0 backups")
    assert queue_info(b, "plain")["backups"].__len__() == 1
    assert queue_info(b, "ha.own")["backups"] == []
    # Up again: the new backups are caught up with the 50 messages.
    status, body = http(a, "PUT", "/api/policies/%2F/ha",
                        {"pattern": "^ha\\.", "priority": 5, "backups": 2})
    assert status == 204, (status, body)
    wait_until(backups_are("ha.x", 2), 15, what="ha.x back to 2 backups")
    wait_until(lambda: everywhere("ha.x", lambda i: sorted(i["in_sync"]) ==
                                  sorted(i["backups"])), 20, what="the new backups in sync")
    info = queue_info(a, "ha.x")
    for name in info["backups"]:
        wait_until(lambda: queue_info(members[name], "ha.x")["replica_messages"] == 50, 10,
                   what="50 messages on backup %s" % name)
    assert queue_info(members[info["primary"]], "ha.x")["messages_ready"] == 50


@test(timeout=60)
def deleting_the_policy_brings_the_default_back():
    a = members["a"]
    status, body = http(a, "DELETE", "/api/policies/%2F/ha")
    assert (status, body) == (204, None), (status, body)
    wait_until(backups_are("ha.x", 1), 15, what="ha.x back to the default 1 backup")
    assert queue_info(a, "ha.x")["policy"] is None
    assert queue_info(a, "ha.own")["backups"] == []
    wait_until(lambda: all(http(m, "GET", "/api/policies")[1] == [] for m in members.values()),
               10, what="no policy anywhere")


@test(timeout=60)
def bad_requests_are_refused():
    a = members["a"]
    status, body = http(a, "PUT", "/api/policies/%2F/bad",
                        {"pattern": "^(ha", "priority": 0, "backups": 1})
    assert status == 400 and "regular expression" in body["reason"], (status, body)
    status, body = http(a, "PUT", "/api/policies/%2F/bad",
                        {"pattern": "x", "priority": 0, "backups": 4})
    assert status == 400, (status, body)
    status, body = http(a, "PUT", "/api/policies/%2F/bad", b'{"pattern": ')
    assert status == 400, (status, body)
    status, body = http(a, "PUT", "/api/policies/nowhere/p",
                        {"pattern": "x", "priority": 0, "backups": 1})
    assert status == 404, (status, body)
    status, body = http(a, "DELETE", "/api/policies/%2F/missing")
    assert status == 404, (status, body)
    # quay-replicate: "all" or "transient", refused in RabbitMQ's words for
    # a bad value of a policy definition key.
    for value, term, shape in (("bogus", '<<"bogus">>', "quay"), (1, "1", "quay"),
                               (None, "null", "quay"), ("bogus", '<<"bogus">>', "rabbitmq")):
        policy = {"pattern": "x", "priority": 0, "backups": 1, "quay-replicate": value}
        if shape == "rabbitmq":  # the definition key, as rabbitmqadmin would send it
            policy = {"pattern": "x", "definition": {"ha-mode": "exactly", "ha-params": 2,
                                                     "quay-replicate": value}}
        status, body = http(a, "PUT", "/api/policies/%2F/bad", policy)
        assert (status, body) == (400, {
            "error": "bad_request",
            "reason": "Validation failed\n\n%s is not a valid quay-replicate value\n" % term}), \
            (status, body)
    assert http(a, "GET", "/api/policies")[1] == []


@test(timeout=60)
def quayctl_sets_lists_and_clears():
    c = members["c"]
    ctl = [os.path.join(os.path.dirname(quayd_path()), "quayctl"),
           "--http", "127.0.0.1:%d" % c.http_port]
    p = subprocess.run(ctl + ["set-policy", "/", "all", ".", "3", "1"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(ctl + ["policies"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "all" in p.stdout, (p.stdout, p.stderr)
    # Every queue without its own argument now wants 3 backups: only 2 other brokers exist.
    wait_until(lambda: everywhere("plain", lambda i: i["replication_factor"] == 4 and
                                  len(i["backups"]) == 2), 15, what="plain at factor 4")
    p = subprocess.run(ctl + ["set-policy", "/", "x", "(", "1"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 76 and "400" in p.stderr, (p.returncode, p.stderr)
    p = subprocess.run(ctl + ["clear-policy", "/", "all"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    wait_until(backups_are("plain", 1), 15, what="plain back to 1 backup")


@test(timeout=60)
def a_single_broker_keeps_its_policies_across_a_restart():
    """Outside a cluster there is nothing to replicate: policies are kept
    (journal definitions) and shown, queues get no backups."""
    class Single:
        http_port = free_port()
    data = tempfile.mkdtemp(prefix="quay-policies-")
    argv = [quayd_path(), "--listen", "127.0.0.1:%d" % free_port(), "--data", data,
            "--http", "127.0.0.1:%d" % Single.http_port]

    def start():
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        wait_until(lambda: _answers(Single), 10, what="the single broker")
        return proc
    proc = start()
    try:
        status, body = http(Single, "PUT", "/api/policies/%2F/ha",
                            {"pattern": "^ha\\.", "priority": 1, "backups": 2,
                             "quay-replicate": "transient"})
        assert (status, body) == (201, None), (status, body)
        status, body = http(Single, "GET", "/api/policies/%2F/ha")
        assert body["definition"]["quay-replicate"] == "transient", body
        # Exported in the definition (RabbitMQ's words for the backups, the
        # key beside them), and an import of the export accepts it.
        status, defs = http(Single, "GET", "/api/definitions")
        assert status == 200 and defs["policies"][0]["definition"] == {
            "ha-mode": "exactly", "ha-params": 3, "quay-replicate": "transient"}, defs
        status, answer = http(Single, "POST", "/api/definitions", defs)
        assert status == 204, (status, answer)
        assert http(Single, "PUT", "/api/policies/%2F/x", {"pattern": "(", "backups": 1})[0] == 400
        proc.terminate()
        assert proc.wait(timeout=15) == 0
        proc = start()
        assert http(Single, "GET", "/api/policies")[1] == [body]
        assert http(Single, "DELETE", "/api/policies/%2F/ha")[0] == 204
        assert http(Single, "DELETE", "/api/policies/%2F/ha")[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        shutil.rmtree(data, ignore_errors=True)


@test(timeout=90)
def without_a_quorum_a_change_is_answered_503():
    """Last (it kills b and c): a PUT through a broker whose cluster lost
    its quorum waits for the map, then is answered 503 (mgmt/api_change.c);
    a client that goes away while its change waits leaves the broker
    serving, its waiting change freed (the sanitizers look at the end)."""
    a = members["a"]
    for name in ("b", "c"):
        members[name].kill()
    policy = {"pattern": "^q\\.", "priority": 0, "backups": 1}
    try:
        api_call("127.0.0.1", a.http_port, "PUT", "/api/policies/%2F/gone", policy, timeout=0.5)
        raise AssertionError("answered with no quorum within 0.5 s")
    except OSError:
        pass  # gave up first: the broker cancels its change
    status, body = http(a, "PUT", "/api/policies/%2F/late", policy)
    assert (status, body["reason"]) == (
        503, "the cluster map is unavailable (no leader or no quorum)"), (status, body)
    assert http(a, "GET", "/api/overview")[0] == 200


def _answers(member):
    try:
        return http(member, "GET", "/api/policies")[0] == 200
    except OSError:
        return False


if __name__ == "__main__":
    run(closer(lambda: cluster))
