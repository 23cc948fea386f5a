"""bench/cluster_fanout.py -- what a message fanned out to several queues of one
remote broker costs on the link. Driven by bench/cluster.sh (row `fanout`);
runnable alone:

  QUAYD=build/quayd /usr/bin/python3 bench/cluster_fanout.py [--messages N] [--size B]
                                                          [--queues Q]

Method: three brokers a, b, c (tests/cluster/clustertest.py). Q queues (10 by
default) named so that the placement ring puts all of them on a, declared
through b and bound to one fanout exchange; a publisher on b sends N messages
of B bytes (1 KiB) with confirms, in windows of 1,000. link_bytes = what b's link
to a carried (GET /api/cluster/links bytes_out) divided by N; every queue must
hold N messages after. The target (issue 15): at most 1.2 KiB for 1 KiB
messages to 10 queues, where one copy per queue took 10.

Prints: ROW fanout queues= size= messages= link_bytes_per_msg= ratio_to_body= msg_s=
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
from clustertest import Cluster  # noqa: E402

import pika  # noqa: E402


def api(member, path):
    return member.api_get(path, timeout=10)  # logged in as the cluster's API user


def bytes_out(src, dst):
    return next(link["bytes_out"] for link in api(src, "/api/cluster/links")["links"]
                if link["name"] == dst.name)


def queues_on(primary, via, count):
    """count queue names declared through via whose primary is primary (the
    others stay until the end: placement balances the brokers' loads)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", via.amqp_port))
    ch = conn.channel()
    names, others, i = [], [], 0
    while len(names) < count:
        name = "fan-%d" % i
        i += 1
        ch.queue_declare(name)
        placed = {q["name"]: q["primary"] for q in api(via, "/api/queues")}
        (names if placed.get(name) == primary.name else others).append(name)
    for name in others:
        ch.queue_delete(name)
    conn.close()
    return names


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--queues", type=int, default=10)
    args = parser.parse_args()
    with Cluster() as cluster:
        a, b, _ = cluster.form(["a", "b", "c"])
        names = queues_on(a, b, args.queues)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.amqp_port))
        ch = conn.channel()
        ch.exchange_declare("fan", "fanout")
        for q in names:
            ch.queue_bind(q, "fan")
        ch.confirm_delivery()
        body = b"f" * args.size
        before = bytes_out(b, a)
        t0 = time.monotonic()
        for _ in range(args.messages):
            ch.basic_publish("fan", "", body)
        took = time.monotonic() - t0
        per = (bytes_out(b, a) - before) / args.messages
        counts = [ch.queue_declare(q, passive=True).method.message_count for q in names]
        conn.close()
        ok = all(c == args.messages for c in counts)
        print("ROW fanout queues=%d size=%d messages=%d link_bytes_per_msg=%.0f "
              "ratio_to_body=%.3f msg_s=%.0f%s" % (
                  args.queues, args.size, args.messages, per, per / args.size,
                  args.messages / took, "" if ok else " status=fail counts=%r" % counts))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
