"""bench/restart_ab.py -- what a restart of one broker costs with a deep durable
queue, A/B: broker A (QUAYD_A) fills a durable queue with N persistent 1 KiB
messages (quayscale fill, confirmed) and stops (SIGTERM); then A and B
(QUAYD_B) restart on that same data directory in turn, REPS pairs, the order
alternating (AB, BA, AB, ...), each stopped with SIGTERM before the next.
A restart changes nothing on disk (a clean log: no tail to cut, nothing to
compact), so every run recovers the same log, from the page cache.

Per run: ready_s, from the launch to the "quayd ready" log line (the
listener opens just before it); accept_s, from the launch to the first
connection.start a probe gets back (it connects every 5 ms from the launch);
recovery_s, the broker's own "recovered ... in X s" (durable_open); and the
count a passive queue.declare then sees (must be N). Prints one RESULT line
per run, then the medians of A and B and the load average.

    QUAYD_A=../main/build/quayd QUAYD_B=build/quayd N=100000 REPS=3 PORT=48100 \\
        /usr/bin/python3 bench/restart_ab.py
"""
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N = int(os.environ.get("N", "100000"))
REPS = int(os.environ.get("REPS", "3"))
PORT = int(os.environ.get("PORT", "48100"))
QUAYD = {"A": os.environ.get("QUAYD_A", os.path.join(ROOT, "..", "main", "build", "quayd")),
         "B": os.environ.get("QUAYD_B", os.path.join(ROOT, "build", "quayd"))}
QUAYSCALE = os.environ.get("QUAYSCALE", os.path.join(ROOT, "build", "bench", "quayscale"))
QUEUE = "restart-ab"


def build_quayscale():
    src = os.path.join(HERE, "quayscale.c")
    if os.path.exists(QUAYSCALE) and os.path.getmtime(QUAYSCALE) >= os.path.getmtime(src):
        return
    os.makedirs(os.path.dirname(QUAYSCALE), exist_ok=True)
    libs = subprocess.check_output(["pkg-config", "--cflags", "--libs", "librabbitmq"],
                                   text=True).split()
    subprocess.check_call(["cc", "-O2", "-std=c17", "-Wall", "-Wextra", "-o", QUAYSCALE, src] +
                          libs + ["-lpthread", "-lm"])


def probe(t0, out, stop):
    """Connects every 5 ms until the broker answers the protocol header."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=1) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                # A method frame (connection.start); not our own header
                # back, which a socket connected to itself (its ephemeral
                # port the one probed, nothing listening) returns.
                if s.recv(1) == b"\x01":
                    out.append(time.monotonic() - t0)
                    return
        except OSError:
            pass
        time.sleep(0.005)


class Broker:
    def __init__(self, binary, data, log):
        self.t0 = time.monotonic()
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([binary, "--data", data, "--listen", "127.0.0.1:%d" % PORT],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []

    def wait_line(self, pattern, timeout):
        """Seconds from the launch to the first log line matching pattern."""
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 1)
            if not ready:
                continue
            chunk = os.read(self.proc.stderr.fileno(), 65536)
            if not chunk:
                raise RuntimeError("quayd exited: %s" % b"".join(self.lines)[-2000:])
            at = time.monotonic() - self.t0
            self.log.write(chunk)
            buf += chunk
            *whole, buf = buf.split(b"\n")
            for line in whole:
                self.lines.append(line + b"\n")
                if re.search(pattern, line):
                    return at
        raise RuntimeError("no %r within %d s" % (pattern, timeout))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        # (drain its log so that it never blocks on a full pipe)
        while True:
            chunk = os.read(self.proc.stderr.fileno(), 65536)
            if not chunk:
                break
            self.log.write(chunk)
        self.proc.wait(600)
        self.log.close()


def declare(passive):
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", PORT))
    try:
        return c.channel().queue_declare(QUEUE, durable=True, passive=passive).method.message_count
    finally:
        c.close()


def restart(which, data, log):
    stop = threading.Event()
    accepted = []
    t0 = time.monotonic()
    prober = threading.Thread(target=probe, args=(t0, accepted, stop))
    prober.start()
    b = Broker(QUAYD[which], data, log)
    b.t0 = t0
    try:
        ready = b.wait_line(rb"quayd ready", 600)
        prober.join(30)
        stop.set()
        text = b"".join(b.lines).decode("utf-8", "replace")
        m = re.search(r"recovered .* (\d+) messages in ([0-9.]+) s", text)
        count = declare(passive=True)
        return {"ready_s": ready, "accept_s": accepted[0] if accepted else float("nan"),
                "recovery_s": float(m.group(2)) if m else float("nan"), "count": count}
    finally:
        stop.set()
        b.stop()


def main():
    build_quayscale()
    tmp = tempfile.mkdtemp(prefix="quay-restart-ab.")
    data, log = os.path.join(tmp, "data"), os.path.join(tmp, "quayd.log")
    try:
        b = Broker(QUAYD["A"], data, log)
        b.wait_line(rb"quayd ready", 60)
        declare(passive=False)
        names = os.path.join(tmp, "names")
        with open(names, "w") as f:
            f.write(QUEUE + "\n")
        fill = subprocess.check_output([QUAYSCALE, "fill", "-H", "127.0.0.1", "-p", str(PORT),
                                        "--names", names, "-n", str(N), "-s", "1024"], text=True)
        print(fill.strip(), flush=True)
        b.stop()
        du = subprocess.check_output(["du", "-sb", data], text=True).split()[0]
        print("# data %s bytes; A=%s B=%s" % (du, QUAYD["A"], QUAYD["B"]), flush=True)
        runs = {"A": [], "B": []}
        for rep in range(REPS):
            for which in ("AB" if rep % 2 == 0 else "BA"):
                r = restart(which, data, log)
                runs[which].append(r)
                print("RESULT rep=%d broker=%s ready_s=%.3f accept_s=%.3f recovery_s=%.3f "
                      "count=%d load=%s" % (rep + 1, which, r["ready_s"], r["accept_s"],
                                            r["recovery_s"], r["count"],
                                            open("/proc/loadavg").read().split()[0]), flush=True)
                if r["count"] != N:
                    sys.exit("broker %s recovered %d messages, not %d" % (which, r["count"], N))
        for key in ("ready_s", "accept_s", "recovery_s"):
            a = statistics.median(r[key] for r in runs["A"])
            b_ = statistics.median(r[key] for r in runs["B"])
            print("MEDIAN %s N=%d A=%.3f B=%.3f B/A=%.3f" % (key, N, a, b_, b_ / a))
        print("LOAD %s" % open("/proc/loadavg").read().strip())
    finally:
        if os.environ.get("KEEP_TMP") == "1":
            print("# kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
