"""08-amqplib: the unchanged Node.js client amqplib against the broker.

Goal: amqplib (npm package `amqplib`, the AMQP 0-9-1 client for Node.js,
exact version pinned in tests/integration/node/package.json and
package-lock.json) works unchanged.  (This file used to test the Python
package of the same name, which speaks AMQP 0-8; quay speaks 0-9-1 only.)

Method: run tests/integration/node/interop.js with node against the broker
fixture, once with amqplib's defaults (frame_max 131072, the server's
heartbeat) and once with `frameMax=4096&heartbeat=2` in the URL (a 300 KB body
in ~75 frames, and an idle period of 7 s that only survives if the broker
sends heartbeats and accepts the client's).  The program uses the promise API:
connect amqp://guest:guest@HOST:PORT, createConfirmChannel, assertExchange
(topic) + assertQueue (exclusive, server-named) + bindQueue, publishes 1000
persistent messages with properties and a headers table of every field type
amqplib encodes, waitForConfirms; checkQueue counts; consumes with prefetch
50 and manual acks, checking that the window fills to exactly 50 and stops,
order, delivery fields and every property; get (ack, nack+requeue ->
redelivered, noAck, a 300 KB body, empty); a mandatory unroutable publish
producing a 'return' event (312 NO_ROUTE) and a confirm ack; a channel error
(checkQueue of a missing queue: the channel closes with 404 from
queue.declare, the connection and the other channel survive, a new channel
works); purge; deleteQueue; a clean close.  It prints one `OK <step>` line
per step; the test requires exit status 0 and every expected line, in order.

A missing node/npm or an uninstalled amqplib is a FAILURE naming what to
install (CI installs both with scripts/setup.sh), never a silent skip.
"""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DIR = os.path.join(HERE, "node")
SCRIPT = os.path.join(NODE_DIR, "interop.js")
INSTALL_HINT = ("run scripts/setup.sh (it installs the Debian packages nodejs and npm, "
                "then `npm ci --prefix tests/integration/node --no-audit --no-fund`)")

EXPECTED = [
    "OK connect",
    "OK declare",
    "OK publish-confirm 1000",
    "OK check-queue 1000 messages 0 consumers",
    "OK consume 1000 in order with prefetch 50",
    "OK basic-get",
    "OK mandatory-return",
    "OK channel-error 404, connection survives",
    "OK purge",
    "OK delete-queue",
]
EXPECTED_HEARTBEAT = ["OK heartbeat 2 s, idle 7 s"]
EXPECTED_END = ["OK close", "ALL OK"]


def _node():
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        raise AssertionError("node not found on PATH: install the Debian package nodejs; "
                             + INSTALL_HINT)
    return node


def _check_amqplib():
    """node_modules/amqplib must exist and be the version package.json pins."""
    with open(os.path.join(NODE_DIR, "package.json")) as f:
        pinned = json.load(f)["dependencies"]["amqplib"]
    installed = os.path.join(NODE_DIR, "node_modules", "amqplib", "package.json")
    if not os.path.isfile(installed):
        raise AssertionError("amqplib %s is not installed in %s: %s"
                             % (pinned, NODE_DIR, INSTALL_HINT))
    with open(installed) as f:
        version = json.load(f)["version"]
    if version != pinned:
        raise AssertionError("node_modules has amqplib %s, package.json pins %s: %s"
                             % (version, pinned, INSTALL_HINT))
    return version


def _run_interop(query=None, expected=EXPECTED + EXPECTED_END):
    node = _node()
    version = _check_amqplib()
    b = broker()
    argv = [node, SCRIPT, b.host, str(b.port)] + ([query] if query else [])
    p = subprocess.run(argv, cwd=NODE_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=150)
    text = p.stdout.decode("utf-8", "replace")
    print("# amqplib %s, %s" % (version, " ".join(argv[1:])))
    for line in text.splitlines():
        print("# node: %s" % line)
    got = [l for l in text.splitlines() if l.startswith("OK ") or l == "ALL OK"]
    fail = [l for l in text.splitlines() if l.startswith("FAIL ")]
    if p.returncode != 0 or got != expected:
        raise AssertionError("interop.js exited %d; %s; passed steps %r"
                             % (p.returncode, fail[0] if fail else "no FAIL line", got))


@test(timeout=180)
def amqplib_defaults():
    _run_interop()


@test(timeout=180)
def amqplib_small_frames_heartbeat():
    _run_interop("frameMax=4096&heartbeat=2", EXPECTED + EXPECTED_HEARTBEAT + EXPECTED_END)


if __name__ == "__main__":
    run()
