#!/usr/bin/python3
"""bench/console_load.py: how long the web console takes to draw its data against a cluster
(issue 20's target: "the console loads in < 1 s against a 5-broker cluster with 10,000
queues"; bench/RESULTS.md "Issue 20's management targets").

Starts BROKERS release brokers as a cluster (bench/cluster.sh's way: one secret, broker 1
forms, the others join it), declares QUEUES queues through broker 2 with quayscale (one
backup each, the default; spread over the brokers by placement), then for each repetition
and each view (interleaved) opens a fresh headless Chromium (its own profile: nothing cached)
on broker 1's console with the login in the URL fragment, as tests/integration/40-console.py
does, and polls the page over the DevTools pipe (tests/integration/chromium.py, the test's
too) every 5 ms for the first completed refresh (`body[data-refreshes] >= 1`: the view's
requests answered and their data drawn). The figure
is the page's own performance.now() at that poll: milliseconds since its navigation began
(the HTML, scripts, login, the view's API calls, drawing), at most 5 ms late. Before the
page loads, each API request the views make is timed from the script (REPS times, median):
the server's part.

    QUAYD=build/quayd REPS=5 /usr/bin/python3 bench/console_load.py
    VIEWS=overview,cluster,queues QUEUES=10000 BROKERS=5 ...
    RESOURCES=1 ...     # also each request of the page: start and end, ms since navigation

Prints one line per load and the medians per view, and the load average.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from chromium import CHROMIUM, LivePage  # noqa: E402

QUAYD = os.environ.get("QUAYD", os.path.join(ROOT, "build/quayd"))
BROKERS = int(os.environ.get("BROKERS", "5"))
QUEUES = int(os.environ.get("QUEUES", "10000"))
REPS = int(os.environ.get("REPS", "5"))
VIEWS = os.environ.get("VIEWS", "overview,cluster,queues").split(",")
BASE = int(os.environ.get("BASE_PORT", str(20000 + (os.getpid() * 7) % 9000)))
BENCH_OUT = os.environ.get("BENCH_OUT", os.path.join(ROOT, "build/bench"))


def amqp_port(n):
    return BASE + n


def cluster_port(n):
    return BASE + 20 + n


def http_port(n):
    return BASE + 40 + n


def get(n, path, timeout=30):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (http_port(n), path))
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


class Cluster:
    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        with open(os.path.join(tmp, "secret"), "wb") as f:
            f.write(os.urandom(32).hex().encode())

    def start(self, n):
        args = [QUAYD, "--name", "b%d" % n, "--listen", "127.0.0.1:%d" % amqp_port(n),
                "--data", os.path.join(self.tmp, "b%d" % n),
                "--cluster-listen", "127.0.0.1:%d" % cluster_port(n),
                "--cluster-secret-file", os.path.join(self.tmp, "secret"),
                "--http", "127.0.0.1:%d" % http_port(n)]
        if n > 1:
            args += ["--join", "127.0.0.1:%d" % cluster_port(1)]
        log = open(os.path.join(self.tmp, "b%d.log" % n), "wb")
        self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

    def up(self, n):
        try:
            return sum(b["state"] == "up" for b in get(n, "/api/cluster", 5)["brokers"])
        except (OSError, ValueError, KeyError):
            return 0

    def form(self):
        self.start(1)
        self.wait(lambda: self.up(1) >= 1)
        for n in range(2, BROKERS + 1):
            self.start(n)
        for n in range(1, BROKERS + 1):
            self.wait(lambda: self.up(n) >= BROKERS)

    @staticmethod
    def wait(cond, timeout=60):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.1)

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Page(LivePage):
    """Headless Chromium on one URL, attached before it loads
    (tests/integration/chromium.py), with a profile of its own."""

    call_timeout = 30

    def __init__(self, url):
        super().__init__("about:blank", profile_prefix="quay-console-load-")
        self.navigate(url)

    def first_draw_ms(self, timeout=60):
        deadline = time.monotonic() + timeout
        probe = ("[location.href.startsWith('http') && document.body ? "
                 "Number(document.body.dataset.refreshes || 0) : 0, performance.now(), "
                 "document.getElementById('status') ? "
                 "document.getElementById('status').textContent : '']")
        while time.monotonic() < deadline:
            value = self.evaluate(probe)
            if value and value[0] >= 1:
                if os.environ.get("RESOURCES") == "1":  # where the time went
                    for r in self.evaluate(
                            "performance.getEntriesByType('resource').map((e) => "
                            "[e.name.replace(location.origin, ''), Math.round(e.startTime), "
                            "Math.round(e.responseEnd)])"):
                        print("#   %s: %d-%d ms" % (r[0][:60], r[1], r[2]))
                return value[1], value[2]
            time.sleep(0.005)
        raise AssertionError("the page drew nothing in %d s" % timeout)


ENDPOINTS = ["/api/whoami", "/api/overview", "/api/cluster", "/api/cluster/placement",
             "/api/queues?page=1&page_size=50&sort=name&sort_reverse=false&columns="
             "vhost,name,state,messages_ready,messages_unacknowledged,messages,consumers"]


def endpoints(reps):
    """What the views ask, timed from here (no browser): the server's part."""
    for path in ENDPOINTS:
        took = []
        for _ in range(reps):
            t = time.monotonic()
            get(1, path)
            took.append((time.monotonic() - t) * 1000)
        print("endpoint %s median_ms=%.1f (of %s)" % (
            path.split("?")[0] + ("?page=1..." if "?" in path else ""), statistics.median(took),
            ", ".join("%.1f" % v for v in took)), flush=True)


def main():
    assert CHROMIUM, "no chromium"
    tmp = tempfile.mkdtemp(prefix="quay-console-load-")
    cluster = Cluster(tmp)
    try:
        cluster.form()
        t0 = time.monotonic()
        subprocess.run([os.path.join(BENCH_OUT, "quayscale"), "queues", "-p", str(amqp_port(2)),
                        "-n", str(QUEUES), "--keep"], check=True, stdout=subprocess.DEVNULL)
        Cluster.wait(lambda: all(get(n, "/api/cluster")["queues"] >= QUEUES
                                 for n in range(1, BROKERS + 1)), 300)
        print("# %d brokers, %d queues declared in %.1f s; pairs: %s" % (
            BROKERS, QUEUES, time.monotonic() - t0,
            [(p["primary"], p["backup"], p["queues"])
             for p in get(1, "/api/cluster/placement")["pairs"]]))
        time.sleep(3)
        endpoints(REPS)
        results = {v: [] for v in VIEWS}
        for rep in range(REPS):
            for view in VIEWS:
                url = "http://127.0.0.1:%d/#%s&user=guest&password=guest" % (http_port(1), view)
                page = Page(url)
                try:
                    ms, status = page.first_draw_ms()
                finally:
                    page.close()
                results[view].append(ms)
                print("rep=%d view=%s first_draw_ms=%.0f status=%r load=%s" % (
                    rep + 1, view, ms, status, os.getloadavg()[0]), flush=True)
        for view in VIEWS:
            print("median view=%s first_draw_ms=%.0f (of %s)" % (
                view, statistics.median(results[view]),
                ", ".join("%.0f" % v for v in results[view])))
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
