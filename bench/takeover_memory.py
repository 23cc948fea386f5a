"""bench/takeover_memory.py -- what adopting a deep log costs the taker in
memory: a 3-broker cluster (tests/cluster/clustertest.py) on one shared
directory (--shared-storage), each with --memory-high-watermark W; a
durable queue without backups on c holding N persistent messages of SIZE
bytes (c pages them out as they come); kill -9 of c. Prints the taker's
peak RSS (VmHWM) before the kill and once the queue is adopted, its RSS
then, how many of the queue's messages are paged out, and the seconds from
the kill to the adoption's end, and the taker's longest loop iteration
(quay_event_loop_lag_seconds) then.

    QUAYD=build/quayd N=8192 SIZE=65536 W=256MiB /usr/bin/python3 bench/takeover_memory.py

A taker that reads the whole log into memory before paging (the alarm's
tick pages only after) peaks at about the log's size above its start; one
that pages while it reads (durable__page_while_reading) stays near half
the watermark.
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
import clustertest  # noqa: E402
from clustertest import (Cluster, declare_until, metric, publish_persistent,  # noqa: E402
                         queue_info, wait_until)

N = int(os.environ.get("N", "8192"))
SIZE = int(os.environ.get("SIZE", "65536"))
W = os.environ.get("W", "256MiB")
if os.environ.get("PORTS"):
    clustertest._PORT_LOW, clustertest._PORT_HIGH = map(int, os.environ["PORTS"].split("-"))


def hwm_kib(member):
    with open("/proc/%d/status" % member.proc.pid) as f:
        return int(f.read().split("VmHWM:")[1].split()[0])


def main():
    cluster = Cluster()
    shared = tempfile.mkdtemp(prefix="shared-", dir=cluster.dir)
    try:
        members = {m.name: m for m in cluster.form(
            ["a", "b", "c"], extra_args=["--shared-storage", shared,
                                         "--memory-high-watermark", W])}
        a, c = members["a"], members["c"]
        name = declare_until("deep", a, lambda q: q is not None and q["primary"] == "c" and
                             q["backups"] == [], **{"x-quay-backups": 0})
        publish_persistent(a, name, N, SIZE)
        time.sleep(1)  # (c's log written)
        before = {m: hwm_kib(members[m]) for m in ("a", "b")}
        c.kill()
        t0 = time.monotonic()
        wait_until(lambda: (queue_info(a, name) or {}).get("primary") in ("a", "b"), 60,
                   what="taken over")
        taker = members[queue_info(a, name)["primary"]]
        wait_until(lambda: metric(taker, "quay_cluster_adoptions_pending") == 0, 120,
                   what="adopted")
        adopted_s = time.monotonic() - t0
        lag_s = metric(taker, "quay_event_loop_lag_seconds")  # (the last 5-10 s)
        time.sleep(1)
        info = next(q for q in taker.api_get("/api/queues") if q["name"] == name)
        node = next(n for n in taker.api_get("/api/nodes") if n["name"].endswith(taker.name))
        print("RESULT messages=%d size=%d log_mib=%.0f watermark=%s taker_hwm_before_kib=%d "
              "taker_hwm_after_kib=%d taker_rss_after_kib=%d taker_mem_used_kib=%d paged=%d "
              "adopted_s=%.2f taker_loop_lag_s=%.3f" % (
                  N, SIZE, N * SIZE / 1048576.0, W, before[taker.name], hwm_kib(taker),
                  taker.rss_kib(), node["mem_used"] // 1024, info["paged"], adopted_s, lag_s))
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
