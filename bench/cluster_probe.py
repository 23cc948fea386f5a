"""bench/cluster_probe.py -- the confirm gap a publisher on a surviving broker
sees when a queue's primary is silently cut off (or killed). Driven by
bench/cluster.sh (rows `cut` and `kill9`); runnable alone:

  QUAYD=build/quayd /usr/bin/python3 bench/cluster_probe.py cut|kill9 [--amqpbench PATH]

Method: three brokers b1, b2, b3, each a host in its own network namespace
(tests/cluster/netlab.py). A durable queue with x-quay-backups=2 whose primary
is the victim, b1 (the Raft leader) or with --victim b3 a follower (names
are tried until placement puts one there). `amqpbench --failover-probe`
publishes 1 KiB messages with confirms via the other two brokers
for DURATION s; AT s after it starts:
  cut    the victim is cut from the other two (nftables drops inside the
         hosts: silence, no resets); the bench process still reaches every
         broker
  kill9  the victim gets kill -9
amqpbench reports the longest gap without a confirm, nacked, and after
reading the queue back lost and dup. Meanwhile /api/queues is polled every
50 ms: promoted_s = the fault until b2's map shows another primary;
b1_primary_s = the fault until the victim stopped calling itself the primary
(role, or "serving" when the broker reports it); ">X" if it still did when
the probe ended. The cut is healed after the probe.

Prints one line: ROW <mode> max_confirm_gap_ms= nacked= lost= dup= ...
"""
import argparse
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
from clustertest import Cluster, wait_until  # noqa: E402
from netlab import Lab  # noqa: E402

USER, PASSWORD = "bench", "bench-pass"


def api_queues(m, timeout=1.0):
    # As USER, whom Cluster.users_file made an administrator.
    return {q["name"]: q for q in m.api_get("/api/queues", timeout=timeout)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["cut", "kill9"])
    p.add_argument("--amqpbench", default=os.environ.get("AMQPBENCH", "/tmp/quay-bench/amqpbench"))
    p.add_argument("--duration", type=float, default=float(os.environ.get("PROBE_DURATION", "10")))
    p.add_argument("--at", type=float, default=float(os.environ.get("PROBE_AT", "4")))
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--victim", choices=["b1", "b3"], default=os.environ.get("PROBE_VICTIM", "b1"),
                   help="the primary to cut or kill: b1 leads the Raft group, b3 does not")
    a = p.parse_args()
    import pika
    lab = Lab(3)
    cluster = Cluster()
    ok = False
    try:
        users = cluster.users_file(USER, PASSWORD)
        ms = []
        for i in (1, 2, 3):
            m = cluster.add("b%d" % i, host=lab.ip(i), netns=lab.ns(i), join=ms[:] or None,
                            extra_args=["--users", users])
            ms.append(m)
            if i == 1:
                wait_until(lambda: cluster.leaders([m]), 15, what="b1 to lead")
        victim = ms[int(a.victim[1]) - 1]
        b2 = ms[1]
        survivors = [m for m in ms if m is not victim]
        expect = {"b1": "up", "b2": "up", "b3": "up"}
        wait_until(lambda: all(m.view() and m.view().brokers == expect for m in ms), 30,
                   what="three brokers up")
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            b2.host, b2.amqp_port, "/", pika.PlainCredentials(USER, PASSWORD)))
        ch = conn.channel()
        name = None
        for i in range(200):
            n = "%sprobe%d" % (a.mode, i)
            ch.queue_declare(n, durable=True, arguments={"x-quay-backups": 2})
            if api_queues(b2)[n]["primary"] == victim.name:
                name = n
                break
            ch.queue_delete(n)
        conn.close()
        if name is None:
            raise SystemExit("no queue name placed on %s" % victim.name)

        def whole():
            q = api_queues(b2)[name]
            return len(q["backups"]) == 2 and sorted(q["in_sync"]) == sorted(q["backups"])
        wait_until(whole, 15, what="both backups in sync")

        eps = ",".join("%s:%d" % (m.host, m.amqp_port) for m in survivors)
        cmd = [a.amqpbench, "--failover-probe", "--endpoints", eps, "-q", name, "--no-setup",
               "-s", str(a.size), "-d", str(a.duration), "--user", USER, "--pass", PASSWORD]
        if os.environ.get("PROBE_RATE"):
            cmd += ["-r", os.environ["PROBE_RATE"]]
        probe = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t_start = time.monotonic()
        fault_at = [None]
        seen = {"promoted": None, "b1_primary_last": None, "b1_serving_field": False}
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                now = time.monotonic()
                try:
                    q = api_queues(b2, timeout=0.5)[name]
                    if fault_at[0] is not None and seen["promoted"] is None \
                            and q["primary"] != victim.name:
                        seen["promoted"] = now - fault_at[0]
                except Exception:
                    pass
                if victim.alive():
                    try:
                        q = api_queues(victim, timeout=0.5)[name]
                        if "serving" in q:
                            seen["b1_serving_field"] = True
                            serving = q["serving"]
                        else:
                            serving = q.get("role") == "primary"
                        if serving:
                            seen["b1_primary_last"] = now
                    except Exception:
                        pass
                time.sleep(max(0.0, 0.05 - (time.monotonic() - now)))
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        time.sleep(max(0.0, t_start + a.at - time.monotonic()))
        fault_at[0] = time.monotonic()
        if a.mode == "cut":
            v = int(a.victim[1])
            lab.partition([v], [i for i in (1, 2, 3) if i != v])
        else:
            victim.kill()
        out, err = probe.communicate(timeout=a.duration + 120)
        end = time.monotonic()
        stop.set()
        poller.join(2)
        m = re.search(r"^RESULT .*$", out, re.M)
        if not m:
            sys.stderr.write(err[-3000:])
            raise SystemExit("amqpbench printed no RESULT (exit %d)" % probe.returncode)
        res = dict(kv.split("=", 1) for kv in m.group(0).split()[1:] if "=" in kv)
        promoted = seen["promoted"]
        if seen["b1_primary_last"] is None or seen["b1_primary_last"] < fault_at[0]:
            b1_primary = "0"
        elif end - seen["b1_primary_last"] < 0.5 and victim.alive():
            b1_primary = ">%.1f" % (end - fault_at[0])
        else:
            b1_primary = "%.2f" % (seen["b1_primary_last"] - fault_at[0])
        print("# %s" % m.group(0))
        # amqpbench's max_confirm_gap_ms only counts gaps that a positive ack
        # closed (or that are still open, unsettled, at the end). A window
        # that is nacked after a stall is not counted: window_nacked_after_s
        # is then the time from the fault to that nack (a lower bound of the
        # real gap when no ack came in between).
        nack_first = float(res.get("nack_first_s", -1))
        stalled = "%.2f" % (nack_first - a.at) if nack_first >= a.at else "-"
        print("ROW %s victim=%s max_confirm_gap_ms=%s nacked=%s lost=%s dup=%s published=%s confirmed=%s "
              "unconfirmed=%s window_nacked_after_s=%s promoted_s=%s b1_%s_s=%s gap_started_at_s=%s "
              "fault_at_s=%.1f" % (
                  a.mode, a.victim, res.get("max_confirm_gap_ms"), res.get("nacked"), res.get("lost"),
                  res.get("dup"), res.get("published"), res.get("confirmed"),
                  res.get("unconfirmed"), stalled, "%.2f" % promoted if promoted is not None else "never",
                  "serving" if seen["b1_serving_field"] else "primary", b1_primary,
                  res.get("gap_started_at_s"), a.at), flush=True)
        ok = probe.returncode == 0
        if os.environ.get("KEEP_TMP") == "1":
            cluster.failed = True     # keep the logs
            sys.stderr.write(err)
    finally:
        lab.heal()
        cluster.failed = cluster.failed or not ok
        cluster.close()
        lab.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
