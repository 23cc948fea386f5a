#!/usr/bin/python3
"""bench/mgmt_overview_cluster.py: what GET /api/overview and GET /api/cluster cost a broker of
a cluster holding many queues (issue 20: the clustered overview cost ~4 ms of the loop a
request; bench/RESULTS.md "A scrape in slices").

Forms two clusters side by side, A (QUAYD_A) and B (QUAYD_B), each of BROKERS release brokers
(bench/console_load.py's way), declares QUEUES queues in each through its broker 2 with
quayscale (one backup each, the default), then ROUNDS rounds, interleaved: per cluster and
path, REQUESTS requests to broker 1 one after another (urllib: the client's time, median) and
broker 1's CPU over them (utime + stime from /proc, 10 ms ticks) per request.

    QUAYD_A=/tmp/base-quayd QUAYD_B=build/quayd /usr/bin/python3 bench/mgmt_overview_cluster.py
    BROKERS=5 QUEUES=10000 ROUNDS=5 REQUESTS=200 ...
    PATHS=/metrics REQUESTS=50 ...     # a clustered broker's scrape (text: read, not parsed)
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import console_load  # noqa: E402  (its Cluster, ports and get)

ROUNDS = int(os.environ.get("ROUNDS", "5"))
REQUESTS = int(os.environ.get("REQUESTS", "200"))
PATHS = os.environ.get("PATHS", "/api/overview,/api/cluster").split(",")


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fetch(path):
    """GET path of broker 1 as guest, read whole (JSON, or /metrics' text)."""
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (console_load.http_port(1), path))
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def with_cluster(binary, base):
    """Points console_load at binary and base port, for the calls that follow."""
    console_load.QUAYD = binary
    console_load.BASE = base


def main():
    a, b = os.environ["QUAYD_A"], os.environ.get("QUAYD_B", "build/quayd")
    bases = {"A": console_load.BASE, "B": console_load.BASE + 100}
    clusters = {}
    tmp = tempfile.mkdtemp(prefix="quay-overview-")
    try:
        for name, binary in (("A", a), ("B", b)):
            with_cluster(os.path.abspath(binary), bases[name])
            os.makedirs(os.path.join(tmp, name))
            c = console_load.Cluster(os.path.join(tmp, name))
            clusters[name] = c
            c.form()
            subprocess.run([os.path.join(console_load.BENCH_OUT, "quayscale"), "queues", "-p",
                            str(console_load.amqp_port(2)), "-n", str(console_load.QUEUES),
                            "--keep"], check=True, stdout=subprocess.DEVNULL)
            c.wait(lambda: all(console_load.get(n, "/api/cluster")["queues"] >=
                               console_load.QUEUES for n in range(1, console_load.BROKERS + 1)),
                   300)
        time.sleep(3)
        results = {(n, p): ([], []) for n in clusters for p in PATHS}
        for rnd in range(ROUNDS):
            for name, c in clusters.items():
                with_cluster(None, bases[name])
                pid = c.procs[0].pid
                for path in PATHS:
                    took = []
                    c0 = cpu_s(pid)
                    for _ in range(REQUESTS):
                        t = time.monotonic()
                        fetch(path)
                        took.append((time.monotonic() - t) * 1000)
                    cpu_ms = (cpu_s(pid) - c0) * 1000 / REQUESTS
                    results[(name, path)][0].append(statistics.median(took))
                    results[(name, path)][1].append(cpu_ms)
                    print("round=%d %s %s median_ms=%.2f cpu_ms_per_request=%.2f load=%.1f" % (
                        rnd + 1, name, path, statistics.median(took), cpu_ms,
                        os.getloadavg()[0]), flush=True)
        print("# %d brokers, %d queues; medians of %d rounds of %d requests" % (
            console_load.BROKERS, console_load.QUEUES, ROUNDS, REQUESTS))
        for (name, path), (ms, cpu) in results.items():
            print("%s %s median_ms=%.2f cpu_ms_per_request=%.2f" % (
                name, path, statistics.median(ms), statistics.median(cpu)))
    finally:
        for name, c in clusters.items():
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
