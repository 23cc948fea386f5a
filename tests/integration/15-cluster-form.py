"""Goal: brokers form a cluster and agree on the cluster map; only brokers
that know the secret get in; the controller (the Raft leader) marks a dead
broker down, a new leader takes over when the leader dies, and a restarted
broker comes back with its id. A quayd without cluster options is unchanged.

Method: tests/cluster/clustertest.py starts real quayd processes on loopback
(free ports, one data dir each, a shared secret file) and reads each
member's view of the map from its log. The tests run in order on one
cluster: form three, refuse a fourth with the wrong secret and one without a
secret file, kill -9 the leader (a new leader in < 5 s, the dead one marked
down), restart it (same id, up again), SIGTERM a follower (down at once, then
back). Measured times are printed as "# ..." lines.
"""
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import Cluster, closer, quayd_path, run, test, wait_until  # noqa: E402
from quaytest import handshake, free_port  # noqa: E402

FAILOVER_MAX_S = 5.0  # under ASan; the requirement for the leader election
MARK_DOWN_MAX_S = 3.0  # measured ~1.6 s; the goal is 2 s

cluster = None
NAMES = ("q1", "q2", "q3")


def views_agree(members, expect):
    """Every member's latest view has exactly the brokers/states in expect."""
    for m in members:
        v = m.view()
        if v is None or v.brokers != expect:
            return False
    return True


def leader_of(members):
    leaders = cluster.leaders(members)
    return leaders[0] if len(leaders) == 1 else None


@test(timeout=120)
def three_brokers_form_a_cluster():
    global cluster
    cluster = Cluster()
    q1 = cluster.add("q1")
    wait_until(lambda: leader_of([q1]), 15, what="q1 to lead its new cluster")
    t0 = time.monotonic()
    q2 = cluster.add("q2", join=[q1])
    q3 = cluster.add("q3", join=[q1, q2], config_file=True)  # options from --config
    members = [q1, q2, q3]
    expect = {n: "up" for n in NAMES}
    wait_until(lambda: views_agree(members, expect), 20, what="all three up in every view")
    print("# join: q2 and q3 up in every member's map %.2f s after q2 was started"
          % (time.monotonic() - t0))
    assert leader_of(members) is q1, [m.view() for m in members]
    ids = {m.name: m.broker_id() for m in members}
    assert len(set(ids.values())) == 3 and all(ids.values()), ids
    for m in members:
        assert m.view().leader_id == ids["q1"], (m.name, m.view())
        # The join line carries the AMQP address the broker really listens on.
        line = "broker %s (id %d) joined: amqp=127.0.0.1:%d cluster=%s" % (
            m.name, ids[m.name], m.amqp_port, m.cluster_address)
        assert line in q1.log_text(), line
        api = m.api_cluster()
        if api is not None:  # once GET /api/cluster is wired to the HTTP server
            assert api["leader"] == "q1", api
            assert sorted((b["name"], b["state"]) for b in api["brokers"]) == \
                [(n, "up") for n in NAMES], api
    # The AMQP data path is untouched: a client still talks to any broker.
    for m in members:
        s = socket.create_connection(("127.0.0.1", m.amqp_port), timeout=5)
        handshake(s)
        s.close()


@test(timeout=60)
def wrong_secret_is_refused():
    wrong = cluster.write_secret("wrong-secret", "not the cluster's secret at all")
    q1 = cluster.member("q1")
    q4 = cluster.add("q4", join=[q1], secret_file=wrong)
    try:
        # Each side sees the other fail the challenge-response.
        wait_until(lambda: "failed authentication (wrong cluster secret?)" in q4.log_text(),
                   10, what="q4 to fail the handshake")
        wait_until(lambda: "(wrong cluster secret on its side?)" in q1.log_text(), 10,
                   what="q1 to refuse q4")
        time.sleep(2)  # several more join attempts and heartbeats
        for m in cluster.members[:3]:
            assert sorted(m.view().brokers) == list(NAMES), m.view()
        assert q4.view() is None or not q4.view().brokers, q4.view()
    finally:
        rc = q4.stop()
        cluster.members.remove(q4)
    assert rc == 0, rc


def refused_at_start(args, expect_text):
    d = os.path.join(cluster.dir, "refused-%d" % free_port())
    r = subprocess.run([quayd_path(), "--listen", "127.0.0.1:%d" % free_port(), "--data", d,
                        "--cluster-listen", "127.0.0.1:%d" % free_port()] + args,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, (r.returncode, r.stderr)
    assert expect_text in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(d, "raft")), "started anyway"


@test
def no_secret_file_refuses_to_start():
    refused_at_start([], "needs --cluster-secret-file")
    refused_at_start(["--cluster-secret-file", os.path.join(cluster.dir, "missing")],
                     "cannot read the cluster secret file")
    short = cluster.write_secret("short-secret", "tooshort")
    refused_at_start(["--cluster-secret-file", short], "must hold 16..1024 bytes")


@test(timeout=90)
def leader_killed_new_leader_and_marked_down():
    q1, q2, q3 = (cluster.member(n) for n in NAMES)
    old = leader_of([q1, q2, q3])
    assert old is not None
    rest = [m for m in (q1, q2, q3) if m is not old]
    killed_at = old.kill()
    new = wait_until(lambda: leader_of(rest), 15, interval=0.01, what="a new leader")
    elected_s = time.monotonic() - killed_at
    expect = {n: "up" for n in NAMES}
    expect[old.name] = "down"
    wait_until(lambda: views_agree(rest, expect), 15, interval=0.01,
               what="%s marked down" % old.name)
    down_s = time.monotonic() - killed_at
    print("# failover: kill -9 of leader %s -> %s leads after %.2f s, %s marked down "
          "after %.2f s" % (old.name, new.name, elected_s, old.name, down_s))
    assert elected_s < FAILOVER_MAX_S, elected_s
    assert down_s < MARK_DOWN_MAX_S, down_s


@test(timeout=90)
def restarted_broker_rejoins_with_its_id():
    down = next(m for m in cluster.members if not m.alive())
    old_id = down.broker_id()
    rest = [m for m in cluster.members if m.alive()]
    t0 = time.monotonic()
    down.start()
    members = rest + [down]
    expect = {n: "up" for n in NAMES}
    wait_until(lambda: views_agree(members, expect), 20, what="%s up again" % down.name)
    print("# restart: %s up again in every map %.2f s after its start"
          % (down.name, time.monotonic() - t0))
    assert down.broker_id() == old_id
    assert leader_of(members) is not None


@test(timeout=90)
def follower_stopped_cleanly_is_down_at_once():
    leader = leader_of(cluster.members)
    follower = next(m for m in cluster.members if m is not leader)
    rest = [m for m in cluster.members if m is not follower]
    t0 = time.monotonic()
    assert follower.stop() == 0
    expect = {n: "up" for n in NAMES}
    expect[follower.name] = "down"
    wait_until(lambda: views_agree(rest, expect), 10, interval=0.01,
               what="%s marked down" % follower.name)
    print("# SIGTERM of follower %s: marked down after %.2f s"
          % (follower.name, time.monotonic() - t0))
    follower.start()
    wait_until(lambda: views_agree(cluster.members, {n: "up" for n in NAMES}), 20,
               what="%s up again" % follower.name)


@test(timeout=90)
def follower_killed_is_marked_down():
    leader = leader_of(cluster.members)
    follower = next(m for m in cluster.members if m is not leader)
    rest = [m for m in cluster.members if m is not follower]
    killed_at = follower.kill()
    expect = {n: "up" for n in NAMES}
    expect[follower.name] = "down"
    wait_until(lambda: views_agree(rest, expect), 10, interval=0.01,
               what="%s marked down" % follower.name)
    down_s = time.monotonic() - killed_at
    print("# kill -9 of follower %s: marked down after %.2f s" % (follower.name, down_s))
    assert down_s < MARK_DOWN_MAX_S, down_s
    follower.start()
    wait_until(lambda: views_agree(cluster.members, {n: "up" for n in NAMES}), 20,
               what="%s up again" % follower.name)


@test
def single_broker_without_cluster_options_is_unchanged():
    d = os.path.join(cluster.dir, "single")
    port = free_port()
    log_path = d + ".log"
    with open(log_path, "wb") as log:
        p = subprocess.Popen([quayd_path(), "--listen", "127.0.0.1:%d" % port, "--data", d,
                              "--log-level", "info"], stdout=log, stderr=log,
                             stdin=subprocess.DEVNULL)
    try:
        def accepting():
            assert p.poll() is None, open(log_path).read()
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=1)
            except OSError:
                return None
        s = wait_until(accepting, 20, what="the single broker")
        handshake(s)
        s.close()
    finally:
        p.terminate()
        rc = p.wait(10)
    text = open(log_path).read()
    assert rc == 0, (rc, text)
    assert "cluster:" not in text and "consensus id=" not in text, text
    assert not os.path.exists(os.path.join(d, "raft"))
    assert not os.path.exists(os.path.join(d, "cluster-id"))


if __name__ == "__main__":
    run(closer(lambda: cluster))
