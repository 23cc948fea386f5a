"""bench/move_release.py -- what a move leaves on the old primary: a
3-broker cluster (tests/cluster/clustertest.py), a durable queue without
backups (x-quay-backups 0) holding N persistent 1 KiB messages on one
broker, moved to another. The switch keeps the old primary as a backup
until the new primary has applied it, then the repair releases it. Prints
the old primary's RSS and the size of its journal's queue logs before the
move and 2 s after the release, the seconds from the move's request to the
release, and the replica_messages its /api/queues shows then.

    QUAYD=build/quayd N=100000 PORTS=49000-49999 /usr/bin/python3 bench/move_release.py
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
import clustertest  # noqa: E402
from clustertest import (Cluster, declare_until, publish_persistent, queue_info,  # noqa: E402
                         wait_until)

N = int(os.environ.get("N", "100000"))
if os.environ.get("PORTS"):
    clustertest._PORT_LOW, clustertest._PORT_HIGH = map(int, os.environ["PORTS"].split("-"))


def logs_kib(member):
    total = 0
    for root, _, files in os.walk(os.path.join(member.data, "queues")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total // 1024


def main():
    cluster = Cluster()
    try:
        members = {m.name: m for m in cluster.form(["a", "b", "c"])}
        a = members["a"]
        name = declare_until("release", a, lambda q: q is not None and q["primary"] == "a" and
                             q["backups"] == [], **{"x-quay-backups": 0})
        publish_persistent(a, name, N)
        time.sleep(2)  # (its log written)
        before = a.rss_kib(), logs_kib(a)
        target = members["b"]
        t0 = time.monotonic()
        status, answer = a.api_call("POST", "/api/cluster/move", json.dumps(
            {"vhost": "/", "queue": name, "to": target.name}).encode(), timeout=5)
        assert status == 202, (status, answer)
        wait_until(lambda: (lambda i: i["primary"] == target.name and i["backups"] == [])(
            queue_info(a, name)) and a.api_cluster()["moves"] == [], 120,
            what="the move and the release")
        released_s = time.monotonic() - t0
        time.sleep(2)
        after = a.rss_kib(), logs_kib(a)
        held = queue_info(a, name).get("replica_messages")
        print("RESULT messages=%d moved_and_released_s=%.2f rss_before_kib=%d "
              "rss_after_kib=%d logs_before_kib=%d logs_after_kib=%d replica_messages=%s" % (
                  N, released_s, before[0], after[0], before[1], after[1], held))
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
