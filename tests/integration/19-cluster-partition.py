"""Goal: a network partition does not split the cluster's decisions. The
minority side refuses definition changes (541, the client should go to a
broker of the majority); the majority marks the cut-off broker down and goes
on declaring, publishing and consuming; after the partition heals, the
minority broker catches up with everything decided meanwhile and is up
again.

Method: three quayd processes, each in its own network namespace joined by
a bridge (tests/cluster/netlab.py); the partition is nftables rules that
silently drop packets between the hosts (no resets, like a failed switch),
while the test process still reaches every broker through the bridge. The
clients log in as a user from a users file (guest is loopback-only).
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, broker_states as states, closer, connect_as,  # noqa: E402
                         lab_trio, run, test, wait_until)
from netlab import Lab  # noqa: E402

import pika  # noqa: E402
import quaytest as qt  # noqa: E402  (raw frames)

lab = cluster = None
A = B = C = None
USER, PASSWORD = "tester", "lab-pass"


def connect(member):
    return connect_as(member, USER, PASSWORD)


@test(timeout=120)
def three_brokers_in_three_hosts():
    global lab, cluster, A, B, C
    lab = Lab(3)
    cluster = Cluster()
    A, B, C = lab_trio(lab, cluster, ["--users", cluster.users_file(USER, PASSWORD)])
    c = connect(C)
    c.channel().queue_declare("before", durable=True)
    c.close()


@test(timeout=120)
def the_minority_refuses_and_the_majority_goes_on():
    lab.partition([1, 2], [3])
    t0 = time.monotonic()
    # The majority marks c down (silence, no reset: the 2 s rule).
    wait_until(lambda: states(A).get("c") == "down" and states(B).get("c") == "down", 15,
               what="the majority to mark c down")
    print("# majority marked the cut-off broker down %.2f s after the cut"
          % (time.monotonic() - t0))
    # c, alone, cannot commit: a definition change is refused with 541.
    c = connect(C)
    try:
        c.channel().queue_declare("from-minority")
        raise AssertionError("the minority committed a declare")
    except (pika.exceptions.ConnectionClosedByBroker, pika.exceptions.StreamLostError) as e:
        assert getattr(e, "reply_code", None) == 541, e
    # The majority declares, publishes and consumes.
    a = connect(A)
    ch = a.channel()
    ch.queue_declare("during", durable=True)
    ch.confirm_delivery()
    b = connect(B)
    bch = b.channel()
    name = None
    for i in range(40):  # a queue whose primary is in the majority
        n = "maj-%d" % i
        ch.queue_declare(n)
        ch.basic_publish("", n, b"m")
        m = bch.basic_get(n, auto_ack=True)
        ch.queue_delete(n)
        if m[0] is not None:
            name = n
            break
    assert name is not None, "no queue of the majority served a message"
    b.close()
    a.close()
    global c_restored
    c_restored = compact_the_log([A, B], C, "bulk")


def raft(member):
    return member.api_cluster()["raft"]


def compact_the_log(majority, cut_off, prefix):
    """Enough decisions that the leader compacts its log (a snapshot every
    1024 entries) past where the cut-off broker stopped, while that broker
    stays within the entries kept behind the snapshot: after the heal it
    must catch up from the log, not be sent the whole map (consensus.h,
    CONSENSUS_SNAPSHOT_TRAILING). Returns its count of restored snapshots."""
    leader = cluster.leaders(majority)[0]
    taken = raft(leader)["snapshots_taken"]
    restored = raft(cut_off)["snapshots_restored"]
    c = connect(leader)
    ch = c.channel()
    for i in range(1100):
        ch.queue_declare("%s-%d" % (prefix, i))
    c.close()
    wait_until(lambda: raft(leader)["snapshots_taken"] > taken, 10,
               what="the leader to take a snapshot during the partition")
    return restored


def caught_up_from_the_log(member, restored):
    leader = cluster.leaders([A, B, C])[0]
    wait_until(lambda: [f["state"] for f in raft(leader)["followers"]] == ["pipeline"] * 2, 10,
               what="the leader to stream to both followers")
    assert raft(member)["snapshots_restored"] == restored, \
        "%s was sent a snapshot although the leader still held the entries it missed" % member.name
    return leader


@test(timeout=120)
def after_healing_the_minority_catches_up():
    lab.heal()
    expect = {"a": "up", "b": "up", "c": "up"}
    t0 = time.monotonic()
    wait_until(lambda: all(states(m) == expect for m in (A, B, C)), 30,
               what="c up again everywhere")
    print("# c up again %.2f s after the partition healed" % (time.monotonic() - t0))
    wait_until(lambda: sees_on(C, "during"), 10, what="c to know the queue declared without it")
    caught_up_from_the_log(C, c_restored)
    c = connect(C)
    c.channel().queue_declare("after-heal")
    c.close()


def sees_on(member, name):
    c = connect(member)
    try:
        c.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if c.is_open:
            c.close()


@test(timeout=120)
def a_leader_cut_off_is_replaced():
    members = {1: A, 2: B, 3: C}
    leader = cluster.leaders([A, B, C])[0]
    host = [h for h, m in members.items() if m is leader][0]
    rest = [h for h in members if h != host]
    socks = qt.raw_sessions(leader.host, leader.amqp_port, 100, USER, PASSWORD)
    lab.partition([host], rest)
    t0 = time.monotonic()
    # The cut-off leader still leads for a moment: it appends what it is
    # asked (never committed), so its log ends in ~100 entries of a term the
    # next leader never has.
    for i, sock in enumerate(socks):
        sock.sendall(qt.gen_queue_declare(1, "tail-%d" % i, durable=True))
    wait_until(lambda: raft(leader)["last_index"] - raft(leader)["commit_index"] >= 50, 5,
               what="the cut-off leader to append entries it cannot commit")
    others = [members[h] for h in rest]
    wait_until(lambda: len(cluster.leaders(others)) == 1 and
               all(states(m).get(leader.name) == "down" for m in others), 20,
               what="a new leader in the majority, the old one down")
    print("# new leader and old one marked down %.2f s after the cut"
          % (time.monotonic() - t0))
    c = connect(others[0])
    c.channel().queue_declare("new-leader", durable=True)
    c.close()
    # The new leader never heard from the old one: libraft would probe it
    # from the first entry, i.e. send it a snapshot (consensus.c, probe_tune).
    restored = compact_the_log(others, leader, "bulk2")
    old = connect(leader)
    try:
        old.channel().queue_declare("old-leader")
        raise AssertionError("a cut-off leader committed a declare")
    except (pika.exceptions.ConnectionClosedByBroker, pika.exceptions.StreamLostError) as e:
        assert getattr(e, "reply_code", None) == 541, e
    new_leader = cluster.leaders(others)[0]
    hurries = raft(new_leader)["probe_hurries"]
    lab.heal()
    t1 = time.monotonic()
    # The old leader catches up with what was decided without it: the new
    # leader probes it from its own log's end, walks back over the ~100
    # entries only the old one has at the round trip (one per heartbeat
    # would be 10 s), and sends the rest from its log, not a snapshot.
    wait_until(lambda: [f["state"] for f in raft(new_leader)["followers"]] == ["pipeline"] * 2,
               5, what="the new leader to stream to the old one")
    print("# the old leader caught up %.2f s after the heal" % (time.monotonic() - t1))
    wait_until(lambda: sees_on(leader, "new-leader"), 10, what="the old leader caught up")
    wait_until(lambda: all(states(m).get(leader.name) == "up" for m in (A, B, C)), 30,
               what="the old leader back")
    caught_up_from_the_log(leader, restored)
    assert raft(new_leader)["probe_rewinds"] > 0, raft(new_leader)
    assert raft(new_leader)["probe_hurries"] > hurries, raft(new_leader)
    for sock in socks:
        sock.close()


if __name__ == "__main__":
    run(closer(lambda: cluster, lambda: lab))
