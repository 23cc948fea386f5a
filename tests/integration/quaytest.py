"""quaytest -- tiny harness for quay's integration tests.

Three parts:

1. Broker fixture, in one of two modes (QUAY_TEST_MODE):
   - "single" (the default): `$QUAYD --listen 127.0.0.1:PORT --data TMPDIR
     --log-level warn` is started once per test file on a free port, and at
     the end it is stopped with SIGTERM; it must exit 0 within 5 s and its
     stderr must not contain a sanitizer report, or the file fails.
   - "cluster": three quayd processes form a cluster (tests/cluster/
     clustertest.py) with --default-backups 1, and the tests talk to broker
     "b", a follower started with --queue-locator others: every queue the
     tests declare (exclusive, auto-delete and server-named ones too) has its
     primary on another broker, so each test exercises the proxy. Every
     broker must stay up, exit 0 on SIGTERM and log no sanitizer report.
     The brokers' logs are kept (their directory printed) when that fails,
     and always with QUAY_KEEP_LOGS=1 (a test that fails but leaves the
     brokers well does not say so to the fixture it stops itself).
   The same test file runs in both modes (CTest registers each twice, as
   integration.NAME and cluster.NAME): a cluster must not be told apart
   from one broker. If QUAY_TEST_TARGET=host:port is set, every test talks
   to that external broker instead (how the suite is validated against a
   real RabbitMQ 3.10).

2. An independent AMQP 0-9-1 frame encoder/decoder (no pika code) for the
   tests that need to send malformed or exactly-controlled frames.

3. The test runner, tests/cluster/clustertest.py's (the one runner of the
   Python tests) around the broker fixture: `@test` registers a function,
   `run()` runs them in order with a per-test alarm, prints `ok NAME` /
   `FAIL NAME: reason`, then `N passed, M failed`, and exits 1 on any
   failure.  After every test it checks that the broker still accepts a
   fresh connection.

Only the Python standard library is needed for parts 1-3; `pika_connect()`
imports pika lazily.

The management API (Broker(http=True)) needs a login: Broker.api_get() and
Broker.api_call() (tests/cluster/clustertest.py's api_get/api_call, also
exported here) send guest/guest, the default broker's administrator, unless
told otherwise.
"""

import atexit
import itertools
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
import clustertest  # noqa: E402
from clustertest import (API_PASSWORD, API_USER, SANITIZER_MARKERS, APIError,  # noqa: E402,F401
                         TestTimeout, api_authorization, api_call, api_get, free_port)

# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE

# reply codes
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

# (class_id, method_id)
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_SECURE = (10, 20)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_FLOW = (20, 20)
CHANNEL_FLOW_OK = (20, 21)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
EXCHANGE_DECLARE_OK = (40, 11)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
QUEUE_BIND = (50, 20)
QUEUE_BIND_OK = (50, 21)
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_CANCEL = (60, 30)
BASIC_CANCEL_OK = (60, 31)
BASIC_PUBLISH = (60, 40)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_ACK = (60, 80)
BASIC_REJECT = (60, 90)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)
TX_SELECT = (90, 10)
TX_SELECT_OK = (90, 11)
TX_COMMIT = (90, 20)
TX_COMMIT_OK = (90, 21)
TX_ROLLBACK = (90, 30)
TX_ROLLBACK_OK = (90, 31)

# ---------------------------------------------------------------------------
# Broker fixture
# ---------------------------------------------------------------------------



MODE = os.environ.get("QUAY_TEST_MODE", "single")
if MODE not in ("single", "cluster"):
    raise SystemExit("QUAY_TEST_MODE must be 'single' or 'cluster', not %r" % MODE)
CLUSTERED = MODE == "cluster"
CLUSTER_NAMES = ("a", "b", "c")
CLUSTER_CLIENT = "b"   # the broker the tests talk to: a follower that places queues elsewhere


class Broker:
    """The broker under test: external (QUAY_TEST_TARGET), a private quayd,
    or (QUAY_TEST_MODE=cluster) a private 3-broker cluster reached through
    one of its brokers. extra_args go to every quayd; http=True serves the
    management API (self.http_port; None: only in cluster mode, where the
    harness uses it to find primaries); env is the quayd processes'
    environment. self.proc and self.data are the client's broker's."""

    def __init__(self, extra_args=(), host="127.0.0.1", external_ok=True, env=None, http=None,
                 client_args=()):
        self.proc = None
        self.tmpdir = None
        self.stderr_path = None
        self.cluster = None
        self.members = []
        self.http_port = None
        self.extra_args = list(extra_args)
        self.client_args = list(client_args)  # the client's broker's only (its --tls-listen)
        self.env = env
        target = os.environ.get("QUAY_TEST_TARGET") if external_ok else None
        if target:
            host, _, port = target.rpartition(":")
            self.host, self.port = host or "127.0.0.1", int(port)
            self.external = True
        else:
            self.external = False
            self.host = host
            if CLUSTERED:
                self._start_cluster(http is not False)
            else:
                if http:
                    self.http_port = free_port()
                    self.extra_args += ["--http", "127.0.0.1:%d" % self.http_port]
                self.extra_args += self.client_args
                self._start_quayd()

    def _start_cluster(self, http):
        self.cluster, self.members = form_test_cluster(self.extra_args, http, self.host,
                                                       self.env, self.client_args)
        client = self.cluster.member(CLUSTER_CLIENT)
        self.client = client
        self.port, self.proc, self.data = client.amqp_port, client.proc, client.data
        self.http_port = client.http_port
        self.tmpdir = self.cluster.dir

    def api_call(self, method, path, body=None, **kw):
        """A request to the client's broker's management API (logged in as
        guest unless user=/password= say otherwise): (status, parsed JSON)."""
        return api_call("127.0.0.1", self.http_port, method, path, body, **kw)

    def api_get(self, path, **kw):
        """GET path on the client's broker's API: parsed JSON, or APIError."""
        return api_get("127.0.0.1", self.http_port, path, **kw)

    def member(self, name):
        """Cluster mode: the member (clustertest.Member) named name."""
        return self.cluster.member(name)

    def primary_of(self, queue, vhost="/"):
        """Cluster mode: the member that is the queue's primary, or None."""
        for m in self.members:
            info = _queue_info(m, queue, vhost)
            if info is not None:
                return next((x for x in self.members if x.name == info["primary"]), None)
        return None

    def _start_quayd(self):
        quayd = os.environ.get("QUAYD")
        if not quayd or not os.access(quayd, os.X_OK):
            raise RuntimeError("set QUAYD=/path/to/quayd or QUAY_TEST_TARGET=host:port")
        self.port = free_port()
        self.tmpdir = tempfile.mkdtemp(prefix="quay-itest-")
        data = os.path.join(self.tmpdir, "data")
        os.mkdir(data)
        self.stderr_path = os.path.join(self.tmpdir, "quayd.stderr")
        self._stderr = open(self.stderr_path, "wb")
        self.data = data
        listen = ("[%s]:%d" if ":" in self.host else "%s:%d") % (self.host, self.port)
        self.proc = subprocess.Popen(
            [quayd, "--listen", listen, "--data", data, "--log-level", "warn"]
            + self.extra_args,
            stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr, env=self.env)
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        wait_accepting(self.proc, probe_host, self.port, 10, self.stderr_text)

    def stderr_text(self):
        if self.cluster is not None:
            return self.client.log_text()
        if not self.stderr_path:
            return ""
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self):
        """Stop a private quayd (or cluster); return a list of problems
        (empty = fine)."""
        if self.cluster is not None:
            return self._stop_cluster()
        if self.external or self.proc is None:
            return []
        problems = []
        if self.proc.poll() is not None:
            problems.append("quayd died during the tests (exit %s)" % self.proc.returncode)
        else:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(5)
                if rc != 0:
                    problems.append("quayd exited %d after SIGTERM" % rc)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                problems.append("quayd did not exit within 5 s of SIGTERM")
        self._stderr.close()
        text = self.stderr_text()
        for marker in SANITIZER_MARKERS:
            if marker in text:
                problems.append("sanitizer report in quayd stderr (%r)" % marker)
        if problems:
            sys.stdout.write("---- quayd stderr (kept in %s) ----\n%s\n----------------------\n"
                             % (self.tmpdir, text[-20000:]))
        else:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.proc = None
        return problems

    def _stop_cluster(self):
        problems = []
        for m in self.members:
            if m is self.client and self.proc is None:
                continue  # the test stopped it on purpose
            if not m.alive():
                problems.append("broker %s died during the tests (exit %s)"
                                % (m.name, m.proc.returncode))
        self.cluster.failed = bool(problems) or bool(os.environ.get("QUAY_KEEP_LOGS"))
        problems += self.cluster.close()
        if problems:
            for m in self.members:
                sys.stdout.write("---- %s's log (tail) ----\n%s\n" % (m.name, m.log_text()[-6000:]))
        self.cluster = None
        self.members = []
        self.proc = None
        return problems


class Restartable:
    """A broker the test stops, kills and starts again on the same data (the
    durability and crash tests, and the single-mode restarts of 35-users,
    41-limits, 44-passwords): one quayd, or in cluster mode a 3-broker
    cluster (every broker stopped, killed and started together; the client
    talks to b, which places queues elsewhere). start() waits until clients
    can connect; host and port are the client's, http_port its management
    API's (http=True). A single quayd's start(more_args) adds arguments for
    that start only, and its stop() also fails on a sanitizer report in
    its log."""

    def __init__(self, extra_args=(), http=False):
        self.extra_args = list(extra_args)
        self.http = http
        self.dir = tempfile.mkdtemp(prefix="quay-restartable-")
        self.host = "127.0.0.1"
        self.cluster = None
        self.members = []
        self.proc = None
        self.port = free_port()
        self.http_port = free_port() if http and not CLUSTERED else None
        self.data = os.path.join(self.dir, "data")

    def start(self, more_args=()):
        if CLUSTERED:
            assert not more_args, "a cluster restarts with its own arguments"
            self._start_cluster()
        else:
            self._start_one(list(more_args))

    def node(self, **node_kw):
        """The client's broker as a Node (http=True)."""
        return Node("own", self.port, self.http_port, **node_kw)

    def _log_text(self):
        with open(os.path.join(self.dir, "quayd.log"), errors="replace") as f:
            return f.read()

    def _start_one(self, more_args):
        quayd = os.environ.get("QUAYD")
        http = ["--http", "127.0.0.1:%d" % self.http_port] if self.http else []
        log = open(os.path.join(self.dir, "quayd.log"), "ab")
        self.proc = subprocess.Popen([quayd, "--listen", "127.0.0.1:%d" % self.port, "--data",
                                      self.data, "--log-level", "info"] + http +
                                     self.extra_args + more_args,
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        wait_accepting(self.proc, "127.0.0.1", self.port, 20, self._log_text)
        if self.http:
            wait_accepting(self.proc, "127.0.0.1", self.http_port, 20, self._log_text)

    def _start_cluster(self):
        if self.cluster is None:
            self.cluster, self.members = form_test_cluster(self.extra_args, http=self.http)
        else:
            for m in self.members:
                m.start(wait=False)
            for m in self.members:
                m.wait_accepting()
        client = self.cluster.member(CLUSTER_CLIENT)
        self.port, self.proc, self.data = client.amqp_port, client.proc, client.data
        self.http_port = client.http_port
        # A restarted cluster elects a leader and catches up first:
        # connection.open waits for that (up to the handshake timeout).

    def _signal_all(self, sig):
        procs = [m.proc for m in self.members] if self.cluster else [self.proc]
        for p in procs:
            p.send_signal(sig)
        return [p.wait(30) for p in procs]

    def kill(self):
        self._signal_all(signal.SIGKILL)

    def stop(self, sig=signal.SIGTERM):
        """SIGTERM (every broker must exit 0) or another signal."""
        rcs = self._signal_all(sig)
        if sig == signal.SIGTERM and any(rc != 0 for rc in rcs):
            raise AssertionError("exit status %r after SIGTERM; logs in %s" % (
                rcs, self.cluster.dir if self.cluster else self.dir))
        if self.cluster is None:
            reports = [m for m in SANITIZER_MARKERS if m in self._log_text()]
            assert not reports, "sanitizer report in %s/quayd.log: %r" % (self.dir, reports)

    def logs_dir(self):
        return self.cluster.dir if self.cluster else self.dir

    def close(self):
        """After the test: problems (sanitizer reports), [] if none."""
        if self.cluster is None:
            return []
        return self.cluster.close()


def form_test_cluster(extra_args, http=True, host="127.0.0.1", env=None, client_args=()):
    """The cluster mode's cluster: brokers CLUSTER_NAMES with one backup per
    queue, the client's broker (a follower, AMQP on host; client_args are
    its own) placing every queue elsewhere. Returns (clustertest.Cluster,
    members)."""
    cluster = clustertest.Cluster(http=http)
    common = ["--default-backups", "1"] + list(extra_args)

    def per(name):
        client = name == CLUSTER_CLIENT
        mine = ["--queue-locator", "others"] + list(client_args) if client else []
        return {"extra_args": common + mine,
                "amqp_host": host if client else "127.0.0.1", "env": env}
    try:
        return cluster, cluster.form(list(CLUSTER_NAMES), per=per)
    except BaseException:
        cluster.failed = True
        cluster.close()
        raise


def port_accepts(port, host="127.0.0.1"):
    """Whether something accepts a TCP connection on port now."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_accepting(proc, host, port, timeout, log_text):
    """Until a quayd process accepts connections (it must not exit first)."""
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError("quayd exited early with %s:\n%s" % (proc.returncode,
                                                                   log_text()[-3000:]))
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.time() > deadline:
                proc.kill()
                raise RuntimeError("quayd did not accept on port %d within %d s"
                                   % (port, timeout))
            time.sleep(0.05)


def _queue_info(member, queue, vhost):
    """The queue's entry in a member's /api/queues, or None."""
    try:
        return next((q for q in member.api_get("/api/queues", timeout=5)
                     if q["name"] == queue and q.get("vhost", "/") == vhost), None)
    except OSError:
        return None


def make_tls_files(directory, clients=(), days=2):
    """A test PKI made with the openssl command in directory: a CA (ca.pem),
    a server certificate for localhost and 127.0.0.1 (server.pem,
    server.key; good as a client's too, as a broker's for --cluster-tls),
    and one client certificate per name in clients, whose
    subject CN is that name (NAME.pem, NAME.key). Returns {name: path}."""
    def run_openssl(*args):
        subprocess.run(["openssl"] + list(args), check=True, cwd=directory,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)

    def issue(name, subject, ext):
        with open(os.path.join(directory, name + ".ext"), "w") as f:
            f.write(ext)
        run_openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
                    "-out", name + ".csr", "-subj", subject)
        run_openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", name + ".pem", "-days", str(days),
                    "-extfile", name + ".ext")
    os.makedirs(directory, exist_ok=True)
    run_openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                "-out", "ca.pem", "-days", str(days), "-subj", "/CN=quay test CA")
    issue("server", "/CN=localhost",
          "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
          "extendedKeyUsage=serverAuth,clientAuth\n")
    for name in clients:
        issue(name, "/O=quay tests/CN=%s" % name,
              "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    files = {n: os.path.join(directory, n) for n in ("ca.pem", "server.pem", "server.key")}
    for name in clients:
        for ext in (".pem", ".key"):
            files[name + ext] = os.path.join(directory, name + ext)
    return files


_broker = None
_fixture_options = {}


def fixture_options(**kw):
    """Before run(): the broker fixture is made with these Broker options
    (http=True: its management API in both modes), so a module that needs
    them uses the fixture instead of starting brokers of its own beside it."""
    assert _broker is None, "the fixture is made already"
    _fixture_options.update(kw)


def broker():
    global _broker
    if _broker is None:
        _broker = Broker(**_fixture_options)
    return _broker


def is_rabbitmq():
    return broker().external


class Node:
    """One broker a test reaches by its ports (AMQP, HTTP): the broker
    fixture's, one member of its cluster, or a quayd of the test's own.
    api_timeout: the management API's (None: api_call's); pika connections
    get socket_timeout and blocked_connection_timeout, and with tracked
    are closed after the test."""

    def __init__(self, name, amqp_port, http_port, api_timeout=None, socket_timeout=5,
                 blocked_connection_timeout=None, tracked=False):
        self.name, self.amqp_port, self.http_port = name, amqp_port, http_port
        self.api_timeout = api_timeout
        self.socket_timeout = socket_timeout
        self.blocked_connection_timeout = blocked_connection_timeout
        self.tracked = tracked

    def api(self, method, path, body=None, **kw):
        if self.api_timeout is not None:
            kw.setdefault("timeout", self.api_timeout)
        return api_call("127.0.0.1", self.http_port, method, path, body, **kw)

    def get(self, path):
        status, body = self.api("GET", path)
        eq(status, 200, "GET %s on %s" % (path, self.name))
        return body

    def sock(self):
        """A raw socket to its AMQP port, closed after the test."""
        return track(socket.create_connection(("127.0.0.1", self.amqp_port), timeout=5))

    def connect(self, user="guest", password="guest", vhost="/"):
        import pika
        params = pika.ConnectionParameters("127.0.0.1", self.amqp_port, vhost,
                                           pika.PlainCredentials(user, password),
                                           connection_attempts=1,
                                           socket_timeout=self.socket_timeout,
                                           blocked_connection_timeout=(
                                               self.blocked_connection_timeout),
                                           heartbeat=0)
        c = pika.BlockingConnection(params)
        return track(c) if self.tracked else c


def broker_node(name, **node_kw):
    """The fixture's broker called name (a member of its cluster) as a Node;
    in single mode the one broker, named "single", whatever name is asked."""
    b = broker()
    if not CLUSTERED:
        return Node("single", b.port, b.http_port, **node_kw)
    x = b.member(name)
    return Node(x.name, x.amqp_port, x.http_port, **node_kw)


def broker_nodes(**node_kw):
    """Every broker of the fixture as a Node: the one, or each member."""
    b = broker()
    if not CLUSTERED:
        return [Node("single", b.port, b.http_port, **node_kw)]
    return [Node(x.name, x.amqp_port, x.http_port, **node_kw) for x in b.members]


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

def octet(v):
    return struct.pack(">B", v)


def short(v):
    return struct.pack(">H", v)


def long_(v):
    return struct.pack(">I", v)


def longlong(v):
    return struct.pack(">Q", v)


def shortstr(s):
    if isinstance(s, str):
        s = s.encode()
    assert len(s) < 256
    return octet(len(s)) + s


def longstr(s):
    if isinstance(s, str):
        s = s.encode()
    return long_(len(s)) + s


def bits(*flags):
    v = 0
    for i, f in enumerate(flags):
        if f:
            v |= 1 << i
    return octet(v)


class Decimal(tuple):
    """(scale, value) for the 'D' field type."""


class Timestamp(int):
    """Encodes as 'T' in a field table."""


def field_value(v):
    if isinstance(v, bool):
        return b"t" + octet(int(v))
    if isinstance(v, Timestamp):
        return b"T" + longlong(v)
    if isinstance(v, int):
        if -2 ** 31 <= v < 2 ** 31:
            return b"I" + struct.pack(">i", v)
        return b"l" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"d" + struct.pack(">d", v)
    if isinstance(v, Decimal):
        return b"D" + octet(v[0]) + struct.pack(">i", v[1])
    if isinstance(v, str):
        return b"S" + longstr(v)
    if isinstance(v, (bytes, bytearray)):
        return b"x" + longstr(bytes(v))
    if isinstance(v, dict):
        return b"F" + table(v)
    if isinstance(v, (list, tuple)):
        payload = b"".join(field_value(x) for x in v)
        return b"A" + long_(len(payload)) + payload
    if v is None:
        return b"V"
    raise TypeError("cannot encode %r" % (v,))


def table(d):
    payload = b"".join(shortstr(k) + field_value(v) for k, v in (d or {}).items())
    return long_(len(payload)) + payload


def frame(ftype, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + octet(end)


def gen_method(channel, class_id, method_id, args=b""):
    return frame(FRAME_METHOD, channel, short(class_id) + short(method_id) + args)


BASIC_PROPERTIES = [  # (name, kind) in flag-bit order, bit 15 first
    ("content_type", "s"), ("content_encoding", "s"), ("headers", "F"),
    ("delivery_mode", "o"), ("priority", "o"), ("correlation_id", "s"),
    ("reply_to", "s"), ("expiration", "s"), ("message_id", "s"),
    ("timestamp", "L"), ("type", "s"), ("user_id", "s"), ("app_id", "s"),
    ("cluster_id", "s"),
]


def encode_properties(props):
    flags, out = 0, b""
    for i, (name, kind) in enumerate(BASIC_PROPERTIES):
        if name not in props:
            continue
        flags |= 1 << (15 - i)
        v = props[name]
        out += {"s": shortstr, "F": table, "o": octet, "L": longlong}[kind](v)
    return short(flags) + out


def gen_content_header(channel, body_size, props=None, class_id=60):
    return frame(FRAME_HEADER, channel, short(class_id) + short(0) + longlong(body_size)
                 + encode_properties(props or {}))


def gen_body(channel, body):
    return frame(FRAME_BODY, channel, body)


def gen_content(channel, body, props=None, frame_max=131072):
    """Content header plus body frames split to fit frame_max."""
    out = gen_content_header(channel, len(body), props)
    chunk = frame_max - 8
    for i in range(0, len(body), chunk):
        out += gen_body(channel, body[i:i + chunk])
    return out


def gen_connection_start_ok(user="guest", password="guest", mechanism="PLAIN",
                            capabilities=None, response=None):
    caps = {"authentication_failure_close": True, "basic.nack": True,
            "publisher_confirms": True, "consumer_cancel_notify": True,
            "connection.blocked": True}
    if capabilities is not None:
        caps = capabilities
    if response is None:
        if mechanism == "PLAIN":
            response = b"\x00" + user.encode() + b"\x00" + password.encode()
        elif mechanism == "AMQPLAIN":
            # AMQPLAIN: a field table *without* its 4-byte length prefix
            response = table({"LOGIN": user, "PASSWORD": password})[4:]
        else:
            response = b""
    props = {"product": "quaytest", "capabilities": caps}
    return gen_method(0, 10, 11, table(props) + shortstr(mechanism) + longstr(response)
                      + shortstr("en_US"))


def gen_tune_ok(channel_max=2047, frame_max=131072, heartbeat=0):
    return gen_method(0, 10, 31, short(channel_max) + long_(frame_max) + short(heartbeat))


def gen_open(vhost="/"):
    return gen_method(0, 10, 40, shortstr(vhost) + shortstr("") + bits(False))


def gen_connection_close(code=200, text="bye", class_id=0, method_id=0):
    return gen_method(0, 10, 50, short(code) + shortstr(text) + short(class_id) + short(method_id))


def gen_connection_close_ok():
    return gen_method(0, 10, 51)


def gen_channel_open(channel):
    return gen_method(channel, 20, 10, shortstr(""))


def gen_channel_close(channel, code=200, text="bye", class_id=0, method_id=0):
    return gen_method(channel, 20, 40, short(code) + shortstr(text) + short(class_id)
                      + short(method_id))


def gen_channel_close_ok(channel):
    return gen_method(channel, 20, 41)


def gen_channel_flow(channel, active):
    return gen_method(channel, 20, 20, bits(active))


def gen_exchange_declare(channel, name, type_="direct", passive=False, durable=False,
                         auto_delete=False, internal=False, nowait=False, arguments=None):
    return gen_method(channel, 40, 10, short(0) + shortstr(name) + shortstr(type_)
                      + bits(passive, durable, auto_delete, internal, nowait)
                      + table(arguments))


def gen_queue_declare(channel, name="", passive=False, durable=False, exclusive=False,
                      auto_delete=False, nowait=False, arguments=None):
    return gen_method(channel, 50, 10, short(0) + shortstr(name)
                      + bits(passive, durable, exclusive, auto_delete, nowait)
                      + table(arguments))


def gen_queue_bind(channel, queue, exchange, routing_key="", nowait=False, arguments=None):
    return gen_method(channel, 50, 20, short(0) + shortstr(queue) + shortstr(exchange)
                      + shortstr(routing_key) + bits(nowait) + table(arguments))


def gen_queue_delete(channel, queue, if_unused=False, if_empty=False, nowait=False):
    return gen_method(channel, 50, 40, short(0) + shortstr(queue)
                      + bits(if_unused, if_empty, nowait))


def gen_basic_qos(channel, prefetch_count, prefetch_size=0, global_=False):
    return gen_method(channel, 60, 10, long_(prefetch_size) + short(prefetch_count)
                      + bits(global_))


def gen_basic_consume(channel, queue, tag="", no_local=False, no_ack=False,
                      exclusive=False, nowait=False, arguments=None):
    return gen_method(channel, 60, 20, short(0) + shortstr(queue) + shortstr(tag)
                      + bits(no_local, no_ack, exclusive, nowait) + table(arguments))


def gen_basic_publish(channel, exchange, routing_key, mandatory=False, immediate=False):
    return gen_method(channel, 60, 40, short(0) + shortstr(exchange) + shortstr(routing_key)
                      + bits(mandatory, immediate))


def gen_publish(channel, exchange, routing_key, body, props=None, mandatory=False,
                immediate=False, frame_max=131072):
    """basic.publish method + content header + body frames."""
    return (gen_basic_publish(channel, exchange, routing_key, mandatory, immediate)
            + gen_content(channel, body, props, frame_max))


def gen_basic_get(channel, queue, no_ack=False):
    return gen_method(channel, 60, 70, short(0) + shortstr(queue) + bits(no_ack))


def gen_basic_ack(channel, delivery_tag, multiple=False):
    return gen_method(channel, 60, 80, longlong(delivery_tag) + bits(multiple))


def gen_basic_reject(channel, delivery_tag, requeue=True):
    return gen_method(channel, 60, 90, longlong(delivery_tag) + bits(requeue))


def gen_basic_nack(channel, delivery_tag, multiple=False, requeue=True):
    return gen_method(channel, 60, 120, longlong(delivery_tag) + bits(multiple, requeue))


def gen_confirm_select(channel, nowait=False):
    return gen_method(channel, 85, 10, bits(nowait))


def gen_tx_select(channel):
    return gen_method(channel, 90, 10)


def gen_tx_commit(channel):
    return gen_method(channel, 90, 20)


def gen_tx_rollback(channel):
    return gen_method(channel, 90, 30)


def gen_heartbeat():
    return frame(FRAME_HEARTBEAT, 0, b"")


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

class Reader:
    """Sequential decoder over a bytes payload."""

    def __init__(self, data, pos=0):
        self.data, self.pos, self.bitpos, self.bitval = data, pos, 8, 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError("truncated field")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        self.bitpos = 8
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def octet(self):
        return self.unpack(">B")

    def short(self):
        return self.unpack(">H")

    def long(self):
        return self.unpack(">I")

    def longlong(self):
        return self.unpack(">Q")

    def shortstr(self):
        return self.take(self.octet()).decode("utf-8", "replace")

    def longstr(self):
        return self.take(self.long())

    def bit(self):
        if self.bitpos >= 8:
            self.bitval, self.bitpos = self.octet(), 0
        v = bool(self.bitval & (1 << self.bitpos))
        self.bitpos += 1
        return v

    def table(self):
        sub = Reader(self.longstr())
        out = {}
        while sub.pos < len(sub.data):
            k = sub.shortstr()
            out[k] = sub.value()
        return out

    def value(self):
        t = self.take(1)
        simple = {b"b": ">b", b"B": ">B", b"s": ">h", b"u": ">H", b"I": ">i", b"i": ">I",
                  b"l": ">q", b"L": ">Q", b"f": ">f", b"d": ">d"}
        if t in simple:
            return self.unpack(simple[t])
        if t == b"t":
            return bool(self.octet())
        if t == b"T":
            return Timestamp(self.longlong())
        if t == b"D":
            return Decimal((self.octet(), self.unpack(">i")))
        if t == b"S":
            return self.longstr().decode("utf-8", "replace")
        if t == b"x":
            return self.longstr()
        if t == b"F":
            return self.table()
        if t == b"A":
            sub = Reader(self.longstr())
            items = []
            while sub.pos < len(sub.data):
                items.append(sub.value())
            return items
        if t == b"V":
            return None
        raise ValueError("unknown field type %r" % t)


def decode_properties(r):
    flags, words = [], 0
    while True:
        w = r.short()
        words += 1
        flags.extend(bool(w & (1 << (15 - i))) for i in range(15))
        if not w & 1:
            break
    props = {}
    for (name, kind), present in zip(BASIC_PROPERTIES, flags):
        if present:
            props[name] = {"s": r.shortstr, "F": r.table, "o": r.octet,
                           "L": r.longlong}[kind]()
    return props


class ProtocolError(AssertionError):
    pass


DEFAULT_TIMEOUT = 5.0


def recv_exact(sock, n, timeout=DEFAULT_TIMEOUT):
    deadline = time.time() + timeout
    buf = b""
    while len(buf) < n:
        left = deadline - time.time()
        if left <= 0:
            raise ProtocolError("timed out waiting for %d bytes (got %d)" % (n, len(buf)))
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except socket.timeout:
            continue
        if not chunk:
            raise ProtocolError("socket closed by peer (wanted %d bytes, got %d)" % (n, len(buf)))
        buf += chunk
    return buf


def read_frame(sock, timeout=DEFAULT_TIMEOUT):
    """Return (type, channel, payload); checks the frame-end octet."""
    hdr = recv_exact(sock, 7, timeout)
    ftype, channel, size = struct.unpack(">BHI", hdr)
    rest = recv_exact(sock, size + 1, timeout)
    if rest[-1] != FRAME_END:
        raise ProtocolError("bad frame-end octet 0x%02x" % rest[-1])
    return ftype, channel, rest[:-1]


class Method:
    """A decoded method frame: .channel, .class_id, .method_id, .args (Reader)."""

    def __init__(self, channel, payload):
        self.channel = channel
        r = Reader(payload)
        self.class_id, self.method_id = r.short(), r.short()
        self.args = r
        self.payload = payload

    @property
    def id(self):
        return (self.class_id, self.method_id)

    def __repr__(self):
        extra = ""
        if self.id in (CONNECTION_CLOSE, CHANNEL_CLOSE):
            extra = " %r" % (decode_close(self),)
        return "<method %d.%d ch=%d%s>" % (self.class_id, self.method_id, self.channel, extra)


def decode_close(m):
    r = Reader(m.payload, 4)
    return (r.short(), r.shortstr(), r.short(), r.short())


def read_method(sock, timeout=DEFAULT_TIMEOUT, skip_heartbeats=True):
    while True:
        ftype, channel, payload = read_frame(sock, timeout)
        if ftype == FRAME_HEARTBEAT and skip_heartbeats:
            continue
        if ftype != FRAME_METHOD:
            raise ProtocolError("expected a method frame, got frame type %d" % ftype)
        return Method(channel, payload)


def expect_method(sock, class_id, method_id, channel=None, timeout=DEFAULT_TIMEOUT):
    """Read the next method (skipping heartbeats) and assert its identity."""
    m = read_method(sock, timeout)
    if (m.class_id, m.method_id) != (class_id, method_id) or (
            channel is not None and m.channel != channel):
        raise ProtocolError("expected method %d.%d%s, got %r" % (
            class_id, method_id, "" if channel is None else " on ch %d" % channel, m))
    return m


def read_content(sock, timeout=DEFAULT_TIMEOUT):
    """Read a content header + body frames; return (props, body, raw_header_payload)."""
    ftype, channel, payload = read_frame(sock, timeout)
    if ftype != FRAME_HEADER:
        raise ProtocolError("expected content header, got frame type %d" % ftype)
    r = Reader(payload)
    r.short(), r.short()
    size = r.longlong()
    props = decode_properties(r)
    body = b""
    while len(body) < size:
        ftype, channel, chunk = read_frame(sock, timeout)
        if ftype != FRAME_BODY:
            raise ProtocolError("expected body frame, got frame type %d" % ftype)
        body += chunk
    return props, body, payload


def handshake(sock, user="guest", password="guest", mechanism="PLAIN", vhost="/",
              frame_max=131072, heartbeat=0, channel_max=2047, capabilities=None):
    """Full connection setup; returns a dict with server properties and tune values."""
    sock.sendall(PROTOCOL_HEADER)
    m = expect_method(sock, *CONNECTION_START)
    info = {"version": (m.args.octet(), m.args.octet())}
    info["server_properties"] = m.args.table()
    info["mechanisms"] = m.args.longstr().decode().split()
    info["locales"] = m.args.longstr().decode().split()
    sock.sendall(gen_connection_start_ok(user, password, mechanism, capabilities))
    m = expect_method(sock, *CONNECTION_TUNE)
    info["tune"] = (m.args.short(), m.args.long(), m.args.short())
    s_chmax, s_fmax, s_hb = info["tune"]
    neg = lambda c, s: min(c, s) if c and s else (c or s)  # noqa: E731
    info["frame_max"] = neg(frame_max, s_fmax)
    info["channel_max"] = neg(channel_max, s_chmax)
    sock.sendall(gen_tune_ok(info["channel_max"], info["frame_max"], heartbeat))
    sock.sendall(gen_open(vhost))
    m = expect_method(sock, *CONNECTION_OPEN_OK)
    info["known_hosts"] = m.args.shortstr()
    return info


def expect_close(sock, reply_code=None, connection=None, send_close_ok=True,
                 timeout=DEFAULT_TIMEOUT):
    """Read until connection.close or channel.close arrives (other frames are
    skipped) and return (code, text, class_id, method_id).  `connection`=True
    requires connection.close, False requires channel.close.  Replies with the
    matching close-ok unless send_close_ok is False."""
    deadline = time.time() + timeout
    while True:
        ftype, channel, payload = read_frame(sock, max(0.01, deadline - time.time()))
        if ftype != FRAME_METHOD:
            continue
        m = Method(channel, payload)
        if m.id not in (CONNECTION_CLOSE, CHANNEL_CLOSE):
            continue
        is_conn = m.id == CONNECTION_CLOSE
        if connection is not None and is_conn != connection:
            raise ProtocolError("expected %s.close, got %r"
                                % ("connection" if connection else "channel", m))
        close = decode_close(m)
        if reply_code is not None and close[0] != reply_code:
            raise ProtocolError("expected reply code %d, got %r" % (reply_code, close))
        if send_close_ok:
            try:
                sock.sendall(gen_connection_close_ok() if is_conn
                             else gen_channel_close_ok(channel))
            except OSError:
                pass
        return close


def expect_closed_socket(sock, timeout=DEFAULT_TIMEOUT):
    """Drain the socket until the peer closes it; fail on timeout.
    Returns everything read."""
    deadline = time.time() + timeout
    got = b""
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise ProtocolError("socket still open after %.1f s (read %r...)"
                                % (timeout, got[:64]))
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return got
        if not chunk:
            return got
        got += chunk


def assert_no_frame(sock, wait=0.3):
    """Assert nothing (other than heartbeats) arrives within `wait` seconds."""
    deadline = time.time() + wait
    while True:
        left = deadline - time.time()
        if left <= 0:
            return
        try:
            sock.settimeout(left)
            data = sock.recv(1, socket.MSG_PEEK)
        except socket.timeout:
            return
        if not data:
            raise ProtocolError("socket closed unexpectedly")
        ftype, ch, payload = read_frame(sock)
        if ftype != FRAME_HEARTBEAT:
            raise ProtocolError("unexpected frame type %d: %r" % (
                ftype, Method(ch, payload) if ftype == FRAME_METHOD else payload[:40]))


# ---------------------------------------------------------------------------
# Connection helpers (tracked, closed after each test)
# ---------------------------------------------------------------------------

_open_things = []
_uniq = itertools.count(1)


def uniq(prefix="t"):
    """A name unique per run (tests are also run against a long-lived RabbitMQ)."""
    return "quaytest-%s-%d-%d-%d" % (prefix, os.getpid(), int(time.time()) % 100000,
                                    next(_uniq))


def raw_socket(timeout=DEFAULT_TIMEOUT):
    b = broker()
    s = socket.create_connection((b.host, b.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _open_things.append(s)
    return s


def raw_connection(channel=1, **kw):
    """Socket after handshake with `channel` opened (channel=None: none)."""
    s = raw_socket()
    handshake(s, **kw)
    if channel:
        s.sendall(gen_channel_open(channel))
        expect_method(s, *CHANNEL_OPEN_OK, channel=channel)
    return s


def raw_sessions(host, port, n, user, password):
    """n connections to host:port after the handshake, channel 1 open on
    each: to send n definition changes at once (a connection waits for each
    one's answer before reading the next). The caller closes them."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=DEFAULT_TIMEOUT)
        handshake(s, user, password)
        s.sendall(gen_channel_open(1))
        expect_method(s, *CHANNEL_OPEN_OK, channel=1)
        socks.append(s)
    return socks


def declare_queue(sock, channel=1, name="", exclusive=True, **kw):
    """queue.declare over raw frames; returns (queue, message_count, consumer_count)."""
    sock.sendall(gen_queue_declare(channel, name, exclusive=exclusive, **kw))
    m = expect_method(sock, *QUEUE_DECLARE_OK, channel=channel)
    return m.args.shortstr(), m.args.long(), m.args.long()


def basic_get(sock, channel, queue, no_ack=False):
    """basic.get over raw frames.  Returns None for get-empty, else a dict with
    delivery_tag, redelivered, exchange, routing_key, message_count, props,
    body and raw_header (the content header payload as received)."""
    sock.sendall(gen_basic_get(channel, queue, no_ack))
    m = read_method(sock)
    if m.id == BASIC_GET_EMPTY:
        return None
    if m.id != BASIC_GET_OK:
        raise ProtocolError("expected get-ok/get-empty, got %r" % m)
    a = m.args
    out = {"delivery_tag": a.longlong(), "redelivered": a.bit(), "exchange": a.shortstr(),
           "routing_key": a.shortstr(), "message_count": a.long()}
    out["props"], out["body"], out["raw_header"] = read_content(sock)
    return out


def read_delivery(sock, timeout=DEFAULT_TIMEOUT):
    """Read basic.deliver + content; returns a dict like basic_get()."""
    m = expect_method(sock, *BASIC_DELIVER, timeout=timeout)
    a = m.args
    out = {"channel": m.channel, "consumer_tag": a.shortstr(), "delivery_tag": a.longlong(),
           "redelivered": a.bit(), "exchange": a.shortstr(), "routing_key": a.shortstr()}
    out["props"], out["body"], out["raw_header"] = read_content(sock, timeout)
    return out


def pika_params(**kw):
    import pika
    b = broker()
    kw.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
    kw.setdefault("connection_attempts", 1)
    kw.setdefault("socket_timeout", 5)
    kw.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters(host=b.host, port=b.port, **kw)


def pika_connect(**kw):
    import pika
    c = pika.BlockingConnection(pika_params(**kw))
    _open_things.append(c)
    return c


def amqp_url(vhost="%2F"):
    b = broker()
    return "amqp://guest:guest@%s:%d/%s" % (b.host, b.port, vhost)


def track(thing):
    """Register something with .close() to be closed after the current test."""
    _open_things.append(thing)
    return thing


def _close_all():
    while _open_things:
        t = _open_things.pop()
        try:
            if hasattr(t, "is_open") and not t.is_open:
                continue
            t.close()
        except Exception:
            pass


def expect_channel_error(code, fn, *args, **kw):
    """Call fn (pika), expect ChannelClosedByBroker with `code`; return reply text."""
    import pika.exceptions as pe
    try:
        fn(*args, **kw)
    except pe.ChannelClosedByBroker as e:
        if e.reply_code != code:
            raise AssertionError("expected channel close %d, got %d %r"
                                 % (code, e.reply_code, e.reply_text))
        return e.reply_text
    raise AssertionError("expected channel close %d, call succeeded" % code)


def expect_connection_error(code, fn, *args, **kw):
    """Call fn (pika), expect ConnectionClosedByBroker with `code`; return reply text."""
    import pika.exceptions as pe
    try:
        fn(*args, **kw)
    except pe.ConnectionClosedByBroker as e:
        if e.reply_code != code:
            raise AssertionError("expected connection close %d, got %d %r"
                                 % (code, e.reply_code, e.reply_text))
        return e.reply_text
    raise AssertionError("expected connection close %d, call succeeded" % code)


def eq(actual, expected, what=""):
    if actual != expected:
        raise AssertionError("%sexpected %r, got %r" % (what + ": " if what else "",
                                                        expected, actual))


def wait_until(pred, timeout=5.0, interval=0.02, what="condition", detail=None):
    """clustertest.wait_until with one broker's shorter default timeout."""
    return clustertest.wait_until(pred, timeout, interval, what, detail)


def broker_alive():
    """A fresh connection gets through the whole handshake and a clean close."""
    s = raw_socket()
    try:
        handshake(s)
        s.sendall(gen_connection_close())
        expect_method(s, *CONNECTION_CLOSE_OK)
    finally:
        s.close()


# ---------------------------------------------------------------------------
# Runner: clustertest's, with this file's broker fixture around it
# ---------------------------------------------------------------------------

TEST_TIMEOUT = 30


def test(fn=None, timeout=None):
    """Register a test.  Use as @test or @test(timeout=60)."""
    return clustertest.test(fn, timeout, default_timeout=TEST_TIMEOUT)


def _after_test():
    _close_all()
    broker_alive()


def run():
    """Run registered tests (optionally only names given on the command line)
    against the broker fixture, which must still accept a connection after
    each test and stop cleanly at the end."""
    try:
        b = broker()
    except Exception as e:
        print("FAIL broker-start: %s" % e)
        print("0 passed, 1 failed")
        sys.exit(1)
    atexit.register(lambda: b.proc and b.proc.kill())
    print("# broker %s:%d (%s)" % (b.host, b.port, "external" if b.external else "quayd"))
    clustertest.finish(*clustertest.run_tests(after_each=_after_test, after_failure=_close_all,
                                              cleanup=lambda failed: b.stop(),
                                              cleanup_label="broker-shutdown"))
