"""07-java: the unchanged RabbitMQ Java client against the broker.

Goal: the RabbitMQ Java client (Debian librabbitmq-client-java 5.0.0, the
jar under /usr/share/java) works unchanged.

Method: compile tests/integration/java/QuayInterop.java into a temporary
directory (nothing is cached in the source tree) and run it against the
broker fixture, once with the client's default blocking-IO transport and once
with its NIO transport.  The program connects with ConnectionFactory,
declares an exclusive queue and a topic exchange + binding, publishes 1000
persistent messages with properties and headers under publisher confirms
(waitForConfirmsOrDie), consumes them with basicConsume (manual ack,
basicQos(50), checking the prefetch window, order and every property),
exercises basicGet (including a 300 KB multi-frame body), a mandatory
unroutable publish (ReturnListener, 312 NO_ROUTE), a channel error (passive
declare of a missing queue: ShutdownSignalException with 404, the connection
and other channels survive, a new channel opens), tx rollback/commit, and a
clean close.  It prints one `OK <step>` line per step; the test requires exit
status 0 and every expected line, in order.

A missing JDK or jar is a FAILURE naming the Debian package (CI installs them
with scripts/setup.sh), never a silent skip.
"""

import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "java", "QuayInterop.java")
JAVA_DIR = "/usr/share/java"
# (jar, Debian package); slf4j-nop keeps slf4j from warning about a missing binding
COMPILE_JARS = [("amqp-client.jar", "librabbitmq-client-java"), ("slf4j-api.jar", "libslf4j-java")]
RUN_JARS = COMPILE_JARS + [("slf4j-nop.jar", "libslf4j-java")]

EXPECTED = [
    "OK connect",
    "OK declare",
    "OK publish-confirm 1000",
    "OK consume 1000 in order with qos 50",
    "OK basic-get",
    "OK mandatory-return",
    "OK channel-error 404, connection survives",
    "OK tx rollback + commit",
    "OK close",
    "ALL OK",
]

_compiled = None   # temp dir with QuayInterop.class, compiled once per run


def _jar_path(jars):
    paths = []
    for jar, package in jars:
        p = os.path.join(JAVA_DIR, jar)
        if not os.path.isfile(p):
            raise AssertionError("%s not found: install the Debian package %s "
                                 "(scripts/setup.sh)" % (p, package))
        paths.append(p)
    return paths


def _tool(name):
    path = shutil.which(name)
    if not path:
        raise AssertionError("%s not found on PATH: install the Debian package "
                             "default-jdk-headless (scripts/setup.sh)" % name)
    return path


def _compile():
    global _compiled
    if _compiled:
        return _compiled
    javac = _tool("javac")
    out = tempfile.mkdtemp(prefix="quay-java-")
    import atexit
    atexit.register(shutil.rmtree, out, True)
    p = subprocess.run([javac, "-nowarn", "-cp", ":".join(_jar_path(COMPILE_JARS)),
                        "-d", out, SOURCE],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if p.returncode != 0:
        raise AssertionError("javac failed (%d):\n%s" % (p.returncode,
                                                         p.stdout.decode("utf-8", "replace")))
    _compiled = out
    return out


def _run_interop(*extra):
    classes = _compile()
    java = _tool("java")
    b = broker()
    cp = ":".join([classes] + _jar_path(RUN_JARS))
    p = subprocess.run([java, "-cp", cp, "QuayInterop", b.host, str(b.port)] + list(extra),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    text = p.stdout.decode("utf-8", "replace")
    for line in text.splitlines():
        print("# java: %s" % line)
    got = [l for l in text.splitlines() if l.startswith("OK ") or l == "ALL OK"]
    fail = [l for l in text.splitlines() if l.startswith("FAIL ")]
    if p.returncode != 0 or got != EXPECTED:
        raise AssertionError("QuayInterop exited %d; %s; passed steps %r"
                             % (p.returncode, fail[0] if fail else "no FAIL line", got))


@test(timeout=180)
def java_client_blocking_io():
    _run_interop()


@test(timeout=180)
def java_client_nio():
    _run_interop("nio")


if __name__ == "__main__":
    run()
