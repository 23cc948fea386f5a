"""Goal: a broker that is dead for good can be forgotten (POST
/api/cluster/forget, quayctl forget): its queues with an in-sync backup go on
there with every confirmed message, a queue whose only copy it had starts
again empty elsewhere with its definition and bindings, the queues it backed
up get a new backup, its exchanges a new owner; it leaves the map and the
Raft members, and the cluster goes on (a new broker may join). A broker that
is not down, an unknown one or a bad request is refused and changes nothing.

Method: three quayd processes (tests/cluster/clustertest.py) driven with
pika; kill -9 of the broker to forget; the map and the Raft followers read
from GET /api/cluster and /api/queues.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, closer, connect, declare_until, queue_info,  # noqa: E402
                         quayd_path, read_all, run, test, wait_until)

import pika  # noqa: E402

cluster = None
A = B = C = None


def forget(member, body):
    """POSTs body (bytes) to member's /api/cluster/forget: (status, JSON)."""
    return member.api_call("POST", "/api/cluster/forget", body, timeout=5)


def publish(member, queue, n, exchange=""):
    conn = connect(member)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish(exchange, queue if not exchange else "",
                         b"%s-%d" % (queue.encode(), i),
                         pika.BasicProperties(delivery_mode=2))
    conn.close()


@test(timeout=120)
def three_brokers():
    global cluster, A, B, C
    cluster = Cluster()
    A, B, C = cluster.form(["a", "b", "c"])


state = {}


@test(timeout=120)
def what_c_holds():
    # A queue with its backup, a queue with no backup (both primary on c),
    # a queue that c backs up, an exchange c owns bound to the lone queue.
    state["ha"] = declare_until("fg-ha", A, lambda q: q and q["primary"] == "c" and
                        q["in_sync"] == q["backups"] and len(q["backups"]) == 1,
                        **{"x-quay-backups": 1})
    state["solo"] = declare_until("fg-solo", A, lambda q: q and q["primary"] == "c",
                          **{"x-quay-backups": 0})
    state["backed"] = declare_until("fg-backed", A, lambda q: q and q["primary"] != "c" and
                            q["backups"] == ["c"], **{"x-quay-backups": 1})
    conn = connect(C)
    ch = conn.channel()
    ch.exchange_declare("fg-x", "fanout", durable=True)
    ch.queue_bind(state["solo"], "fg-x")
    conn.close()
    publish(B, state["ha"], 200)
    publish(B, state["solo"], 20)
    publish(B, state["backed"], 30)


@test(timeout=60)
def refused_while_up_unknown_or_malformed():
    status, body = forget(A, b'{"broker": "c"}')
    assert status == 409 and "not down" in body["reason"], (status, body)
    status, body = forget(A, b'{"broker": "zz"}')
    assert status == 404, (status, body)
    for bad in (b"", b"{", b'{"broker": 3}', b'{"brokers": "c"}', b"[1]", b'{"broker": ""}',
                b'{"broker": "c\\u0000x"}', b'{"broker": "%s"}' % (b"c" * 300)):
        status, body = forget(A, bad)
        assert status == 400 and body.get("error"), (bad, status, body)
    ctl = os.path.join(os.path.dirname(quayd_path()), "quayctl")
    out = subprocess.run([ctl, "--http", "127.0.0.1:%d" % A.http_port, "forget", "c"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 76 and "409" in out.stderr, (out.returncode, out.stderr)
    # Nothing changed.
    assert queue_info(A, state["solo"])["primary"] == "c"
    assert A.view().brokers == {"a": "up", "b": "up", "c": "up"}


@test(timeout=120)
def a_dead_broker_is_forgotten():
    C.kill()
    wait_until(lambda: A.view().brokers.get("c") == "down", 15, what="c down in a's map")
    # The failover promoted c's backed-up queue already; the lone one waits
    # for c, unavailable.
    wait_until(lambda: queue_info(A, state["ha"])["primary"] != "c", 10, what="the failover")
    ctl = os.path.join(os.path.dirname(quayd_path()), "quayctl")
    out = subprocess.run([ctl, "--http", "127.0.0.1:%d" % B.http_port, "--json", "forget", "c"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, (out.returncode, out.stderr)
    report = json.loads(out.stdout)
    assert report["forgetting"] == "c" and report["emptied"] >= 1, report
    wait_until(lambda: all(m.view() and "c" not in m.view().brokers for m in (A, B)), 15,
               what="c gone from every map")
    # Out of Raft too: the leader replicates to one follower only.
    def followers():
        for m in (A, B):
            info = m.api_cluster()
            if info and m.view().is_leader and info.get("raft", {}).get("followers") is not None:
                return sorted(f.get("name") or str(f["id"]) for f in info["raft"]["followers"])
        return None
    wait_until(lambda: followers() in (["a"], ["b"]), 15, what="c out of the Raft members")


@test(timeout=120)
def its_queues_go_on_elsewhere():
    ha, solo, backed = state["ha"], state["solo"], state["backed"]
    q = queue_info(A, ha)
    assert q["primary"] in ("a", "b") and "c" not in q["backups"], q
    assert sorted(read_all(B, ha)) == sorted(b"%s-%d" % (ha.encode(), i) for i in range(200))
    q = queue_info(A, solo)
    assert q["primary"] in ("a", "b") and q.get("available", True), q
    # Its messages were only on c: it starts again empty, still bound.
    assert read_all(A, solo) == []
    publish(A, solo, 1, exchange="fg-x")
    assert read_all(B, solo) == [b"%s-0" % solo.encode()]
    wait_until(lambda: queue_info(A, backed)["backups"] not in ([], ["c"]), 10,
               what="a new backup for the queue c backed up")
    assert len(read_all(A, backed)) == 30
    conn = connect(A)
    conn.channel().exchange_declare("fg-x", "fanout", durable=True, passive=True)
    conn.close()


@test(timeout=120)
def the_cluster_goes_on_and_grows():
    conn = connect(B)
    ch = conn.channel()
    ch.queue_declare("fg-after", durable=True, arguments={"x-quay-backups": 1})
    conn.close()
    publish(A, "fg-after", 10)
    assert len(read_all(B, "fg-after")) == 10
    D = cluster.add("d", join=[A, B])
    wait_until(lambda: all(m.view() and m.view().brokers == {"a": "up", "b": "up", "d": "up"}
                           for m in (A, B, D)), 30, what="d joined")
    status, _ = forget(A, b'{"broker": "c"}')
    assert status == 404  # forgotten already


if __name__ == "__main__":
    run(closer(lambda: cluster))
