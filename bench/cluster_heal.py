"""bench/cluster_heal.py -- how long after a partition heals every broker
has the map again, when the minority held the Raft leader. Driven by
bench/cluster.sh (row `heal`); runnable alone:

  QUAYD=build/quayd /usr/bin/python3 bench/cluster_heal.py [--reps N] [--declares N]

Method: five brokers, each a host in its own network namespace
(tests/cluster/netlab.py). Each rep: the Raft leader and one other broker
are cut from the other three (nftables drops: silence, no resets); the cut-off
leader is given TAIL definition changes at once (one per connection), which
it appends but cannot commit; once the majority has a leader and has marked
both down, DECLARES queues are declared through it (1,100 by default: past
one snapshot, so the leader's log is compacted meanwhile); then the
partition heals; then its queues are deleted, so every rep starts from the
same map. missed = the entries the cut-off brokers lack at the heal (the new
leader's commit index less their applied index); agreed_s = the heal until
every broker's /api/cluster shows the same map epoch with all five up;
snapshots = snapshots the two cut-off brokers restored meanwhile (0 when they
caught up from the log: expected while missed stays under the 8,192 entries
kept behind a snapshot); rewinds and hurries = the new leader's probe
corrections (src/cluster/consensus.c, probe_tune).

Prints one line per rep:
  ROW heal rep= minority= missed= agreed_s= snapshots= rewinds= hurries=
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from clustertest import Cluster, wait_until  # noqa: E402
from netlab import Lab  # noqa: E402
import quaytest as qt  # noqa: E402  (raw frames)

USER, PASSWORD = "bench", "bench-pass"
NAMES = "abcde"


def view(m):
    return m.api_cluster()


def leader_of(members):
    for m in members:
        v = view(m)
        if v and v.get("leader") == m.name:
            return m
    return None


def agreed(members):
    vs = [view(m) for m in members]
    if any(v is None for v in vs) or len({v["epoch"] for v in vs}) != 1:
        return False
    return all(b["state"] == "up" for v in vs for b in v["brokers"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=int(os.environ.get("HEAL_REPS", "5")))
    p.add_argument("--declares", type=int, default=int(os.environ.get("HEAL_DECLARES", "1100")))
    p.add_argument("--tail", type=int, default=int(os.environ.get("HEAL_TAIL", "100")))
    a = p.parse_args()
    import pika
    lab = Lab(len(NAMES))
    cluster = Cluster()
    ok = False
    try:
        users = cluster.users_file(USER, PASSWORD)
        members = []
        for i, name in enumerate(NAMES):
            kw = dict(extra_args=["--users", users], host=lab.ip(i + 1), netns=lab.ns(i + 1))
            if members:
                kw["join"] = members[:]
            m = cluster.add(name, **kw)
            m.index = i + 1
            members.append(m)
            if i == 0:
                wait_until(lambda: leader_of(members) is not None, 30, what="a to lead")
        wait_until(lambda: agreed(members), 60, what="five brokers up everywhere")

        def connect(m):
            return pika.BlockingConnection(pika.ConnectionParameters(
                m.host, m.amqp_port, "/", pika.PlainCredentials(USER, PASSWORD), heartbeat=0,
                connection_attempts=1, socket_timeout=5))

        for rep in range(1, a.reps + 1):
            old = leader_of(members)
            other = members[(members.index(old) + 1 + (rep - 1) % (len(members) - 1))
                            % len(members)]
            minority = [old, other]
            majority = [m for m in members if m not in minority]
            socks = qt.raw_sessions(old.host, old.amqp_port, a.tail, USER, PASSWORD)
            restored = sum(view(m)["raft"]["snapshots_restored"] for m in minority)
            lab.partition([m.index for m in majority], [m.index for m in minority])
            for i, s in enumerate(socks):
                s.sendall(qt.gen_queue_declare(1, "tail-%d-%d" % (rep, i), durable=True))

            def majority_ready():
                new = leader_of(majority)
                return new is not None and all(
                    b["state"] == "down" for b in view(new)["brokers"]
                    if b["name"] in (old.name, other.name))
            wait_until(majority_ready, 30, what="a leader in the majority, the minority down")
            new = leader_of(majority)
            before = view(new)["raft"]
            c = connect(new)
            ch = c.channel()
            for i in range(a.declares):
                ch.queue_declare("heal-%d-%d" % (rep, i))
            c.close()
            missed = view(new)["raft"]["commit_index"] - min(
                view(m)["raft"]["applied_index"] for m in minority)
            lab.heal()
            t0 = time.monotonic()
            wait_until(lambda: agreed(members), 60, interval=0.02, what="the map agreed")
            dt = time.monotonic() - t0
            after = view(new)["raft"]
            snapshots = sum(view(m)["raft"]["snapshots_restored"] for m in minority) - restored
            print("ROW heal rep=%d minority=%s%s missed=%d agreed_s=%.2f snapshots=%d "
                  "rewinds=%d hurries=%d" % (rep, old.name, other.name, missed, dt, snapshots,
                                             after["probe_rewinds"] - before["probe_rewinds"],
                                             after["probe_hurries"] - before["probe_hurries"]),
                  flush=True)
            for s in socks:
                s.close()
            # The next rep starts from the same map: without its queues (each
            # partition would otherwise fail over more of them, and the
            # entries missed would grow past those kept behind a snapshot).
            wait_until(lambda: agreed(members), 60, what="the map agreed again")
            c = connect(leader_of(members))
            ch = c.channel()
            for i in range(a.declares):
                ch.queue_delete("heal-%d-%d" % (rep, i))
            for i in range(a.tail):
                ch.queue_delete("tail-%d-%d" % (rep, i))
            c.close()
            wait_until(lambda: agreed(members), 60, what="the map agreed after the deletes")
        ok = True
    finally:
        cluster.failed = not ok or os.environ.get("KEEP_TMP") == "1"
        cluster.close()
        lab.close()


if __name__ == "__main__":
    main()
