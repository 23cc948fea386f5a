"""bench/backup_restart.py -- what a restart costs a backup: a 3-broker
cluster (tests/cluster/clustertest.py), a durable queue with one backup
holding N persistent 1 KiB messages; the backup is stopped (SIGTERM) and
started again. Prints the seconds from its start to "caught up with the
map", its journal's recovery line and its RSS 2 s after the sync.

    QUAYD=build/quayd N=100000 /usr/bin/python3 bench/backup_restart.py
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "cluster"))
from clustertest import (Cluster, declare_until, publish_persistent, queue_info,  # noqa: E402
                         wait_until)

N = int(os.environ.get("N", "100000"))


def main():
    cluster = Cluster()
    try:
        members = {m.name: m for m in cluster.form(["a", "b", "c"])}
        a = members["a"]
        name = declare_until("restart", a, lambda q: q is not None and q["primary"] == "a" and
                             q["backups"], **{"x-quay-backups": 1})
        backup = members[queue_info(a, name)["backups"][0]]
        wait_until(lambda: queue_info(a, name)["in_sync"] == [backup.name], 10)
        publish_persistent(a, name, N)
        wait_until(lambda: (queue_info(backup, name) or {}).get("replica_messages") == N, 60,
                   what="the backup to hold them")
        time.sleep(1)  # (its log written)
        backup.stop()
        seen = len(backup.log_text_bytes())
        t0 = time.monotonic()
        backup.start(wait=False)
        wait_until(lambda: b"caught up with the map" in backup.log_text_bytes()[seen:], 120,
                   what="the restarted backup to catch up with the map")
        synced_s = time.monotonic() - t0
        time.sleep(2)
        lines = backup.log_text_bytes()[seen:].decode("utf-8", "replace").splitlines()
        recovery = next((line.split("info", 1)[-1].strip() for line in lines
                         if "messages in" in line), "")
        print("RESULT messages=%d synced_s=%.2f rss_kib=%d recovery=%r" % (
            N, synced_s, backup.rss_kib(), recovery))
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
