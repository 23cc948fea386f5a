"""bench/purge_stall.py -- what a purge of a deep queue costs the other
clients: a 3-broker cluster (tests/cluster/clustertest.py; BROKERS=1 for one
broker) and a durable queue with one backup (placed on broker a) holding N
persistent messages of SIZE bytes (quaybench fills it). While queue.purge
goes to the primary through broker c, a prober on every broker asks for
another queue (a passive declare, answered by the broker itself) over, for
0.5 s before the purge and 1 s after; a broker whose loop is held answers
late. Prints the purge's round
trip and each broker's slowest answer during it:

    ROW purge brokers=3 messages=1000000 purge_ms=31.2 a=32.0 b=1.1 c=2.3

With PRIORITY=P the queue has x-max-priority P and pika fills it (slower:
use N=200000), priorities 0..P in turn.

    QUAYD=build/quayd N=1000000 /usr/bin/python3 bench/purge_stall.py
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
from clustertest import Cluster, connect, queue_info  # noqa: E402

N = int(os.environ.get("N", "1000000"))
SIZE = int(os.environ.get("SIZE", "100"))
BROKERS = int(os.environ.get("BROKERS", "3"))
PRIORITY = int(os.environ.get("PRIORITY", "0"))  # > 0: an x-max-priority queue, pika fills it
QB = os.environ.get("QB", os.path.join(HERE, "..", "build", "bench", "quaybench"))


# A prober of its own (a process: threads of one interpreter wait for each
# other's turns, milliseconds of noise): passive declares for SECONDS, then
# the slowest answer in ms.
PROBER = """
import sys, time, pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
print("ready", flush=True)
sys.stdin.readline()
worst, end = 0.0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    t = time.monotonic()
    ch.exchange_declare("amq.direct", passive=True)
    worst = max(worst, time.monotonic() - t)
    time.sleep(0.002)  # (busy probers would hold the cores themselves)
print("%.1f" % (worst * 1000), flush=True)
"""


def fill_with_priorities(member, name):
    """N persistent messages of priorities 0..PRIORITY in turn (pika: its
    levels interleave, as a priority queue's usually do), confirmed at the
    end."""
    import pika
    c = connect(member)
    ch = c.channel()
    body = b"x" * SIZE
    props = [pika.BasicProperties(delivery_mode=2, priority=p) for p in range(PRIORITY + 1)]
    for i in range(N - 1):
        ch.basic_publish("", name, body, props[i % (PRIORITY + 1)])
    ch.confirm_delivery()
    ch.basic_publish("", name, body, props[0])
    c.close()


def main():
    cluster = Cluster()
    try:
        names = ["a", "b", "c"][:BROKERS]
        backups = ["--default-backups", "1" if BROKERS > 1 else "0"]
        members = {m.name: m for m in cluster.form(names, per=lambda n: {"extra_args": backups})}
        a = members["a"]
        via = members[names[-1]]
        c = connect(a)
        ch = c.channel()
        for i in range(64):  # quaybench fills <prefix>-0: one placed on a
            prefix = "purged%d" % i
            name = prefix + "-0"
            ch.queue_declare(name, durable=True, arguments=(
                {"x-max-priority": PRIORITY} if PRIORITY else {}))
            if queue_info(a, name)["primary"] == "a":
                break
        c.close()
        if PRIORITY:
            fill_with_priorities(via, name)
        else:
            fill = subprocess.run([QB, "-p", str(via.amqp_port), "-C", "0", "-n", str(N), "-s",
                                   str(SIZE), "--confirm", "--persistent", "--durable",
                                   "--keep", "--no-setup", "--prefix", prefix],
                                  capture_output=True, text=True)
            assert "status=ok" in fill.stdout, fill.stdout + fill.stderr
        assert queue_info(a, name)["messages"] == N, queue_info(a, name)
        time.sleep(2)  # the fill's syncs and catch-ups settle
        probers = {n: subprocess.Popen([sys.executable, "-c", PROBER, str(m.amqp_port), "1.5"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                   for n, m in members.items()}
        for p in probers.values():
            assert p.stdout.readline().strip() == "ready"
        c = connect(via)
        ch = c.channel()
        for p in probers.values():
            p.stdin.write("go\n")
            p.stdin.flush()
        time.sleep(0.5)
        t = time.monotonic()
        purged = ch.queue_purge(name).method.message_count
        took = time.monotonic() - t
        worst = {n: float(p.communicate()[0].strip()) for n, p in probers.items()}
        c.close()
        assert purged == N, purged
        print("ROW purge brokers=%d messages=%d priority=%d purge_ms=%.1f %s" % (
            BROKERS, N, PRIORITY, took * 1000,
            " ".join("%s=%.1f" % (n, worst[n]) for n in names)), flush=True)
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
