"""clustertest -- a harness for tests that run several quayd processes as one
cluster on loopback.

Goal: let a test say "start three brokers, kill the leader, wait until the
others agree it is down" in a few lines, and always leave no process or
temporary directory behind.

Method:
  * Cluster owns a temporary directory with a shared secret file; each
    Member gets its own data directory, log file and free ports (AMQP, the
    cluster port, free for both TCP and UDP since the heartbeats use UDP on
    the same number, and an HTTP port when quayd has --http).
  * A member's view of the cluster is read from its log (the lines node.c
    writes: "cluster map epoch=N: ...; brokers: a=up b=down" and "cluster:
    leader is NAME (id N at ADDR)"), so the harness needs nothing but the
    log. When quayd serves GET /api/cluster, Member.api_cluster() returns
    it too (None otherwise).
  * The management API needs a login (HTTP Basic): api_call()/api_get()
    send one, by default the cluster's (Cluster.api_user: guest/guest, the
    default broker's administrator, or the user Cluster.users_file() wrote
    with the administrator tag), so a new test gets it without asking.
    Member.api_get()/api_call() reach that member's API that way.
  * Processes are killed at exit (atexit), whatever happens; the temporary
    directory is removed unless a test failed or a log holds a sanitizer
    report (then its path is printed).
  * The runner of every Python test (tests/integration/quaytest.py's run()
    wraps it with its broker fixture): @test registers, run() runs in order
    with a per-test alarm and prints `ok NAME` / `FAIL NAME: reason`, then
    `N passed, M failed`.

Only the Python standard library is used.
"""

import atexit
import base64
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer")
SANITIZED = os.environ.get("QUAY_SANITIZED", "").lower() in ("1", "on", "true", "yes")

_all_procs = []


def _kill_all():
    for p in _all_procs:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


atexit.register(_kill_all)


def quayd_path():
    q = os.environ.get("QUAYD")
    if not q or not os.access(q, os.X_OK):
        raise RuntimeError("set QUAYD=/path/to/quayd")
    return q


# Ports for brokers come from below the kernel's ephemeral range
# (ip_local_port_range, 32768-60999 by default): a port taken with
# bind(0) is closed again before the broker binds it, and in that gap
# any outgoing connection on the machine (a test's client, a broker's
# link, another test) may be given it; CI lost a run to that. Below the
# range only another test's pick can collide, and a broker that still
# finds its port taken is restarted on fresh ones (Member.start).
_PORT_LOW, _PORT_HIGH = 10000, 32767
_port_random = random.Random()  # seeded from os.urandom: parallel tests differ


def free_port(udp_too=False):
    """A port free on 127.0.0.1 for TCP (and for UDP when asked), outside
    the ephemeral range."""
    for _ in range(200):
        port = _port_random.randint(_PORT_LOW, _PORT_HIGH)
        kinds = [socket.SOCK_STREAM] + ([socket.SOCK_DGRAM] if udp_too else [])
        ok = True
        for kind in kinds:
            s = socket.socket(socket.AF_INET, kind)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                ok = False
            finally:
                s.close()
            if not ok:
                break
        if ok:
            return port
    raise RuntimeError("no free port")


def wait_until(pred, timeout=10.0, interval=0.02, what="condition", detail=None):
    """Polls pred() until it returns a true value (returned) or times out
    (detail(), if given, says what was seen last)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            seen = ": last seen %r" % (detail(),) if detail else ""
            raise AssertionError("timed out after %.1f s waiting for %s%s" % (timeout, what, seen))
        time.sleep(interval)


# The management API's login when nobody says otherwise: quayd's default
# user (an administrator, from loopback).
API_USER, API_PASSWORD = "guest", "guest"


class APIError(OSError):
    """A management API answer other than 2xx: .status, .body (parsed, or None)."""

    def __init__(self, method, url, status, body):
        super().__init__("%s %s: HTTP %d %s" % (method, url, status, body))
        self.status = status
        self.body = body


def api_authorization(user=API_USER, password=API_PASSWORD):
    """The Authorization header value for HTTP Basic."""
    raw = ("%s:%s" % (user, password)).encode("utf-8")
    return "Basic " + base64.b64encode(raw).decode("ascii")


def api_call(host, port, method, path, body=None, user=API_USER, password=API_PASSWORD,
             headers=None, timeout=10):
    """One request to quayd's management API logged in as user (user=None:
    no Authorization header). body: a dict/list (sent as JSON), bytes, or
    None; a PUT or POST says Content-Type: application/json, as the API
    demands. headers override or add. Returns (status, parsed JSON or None)."""
    h = {"Accept": "application/json"}
    if user is not None:
        h["Authorization"] = api_authorization(user, password)
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    if method in ("PUT", "POST"):
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = data
    return r.status, parsed


def api_get(host, port, path, timeout=10, **kw):
    """GET path as parsed JSON; raises APIError unless the answer is 200.
    (An APIError is an OSError, like the refused connection of a broker
    that is down, so pollers catch both with one except.)"""
    status, body = api_call(host, port, "GET", path, timeout=timeout, **kw)
    if status != 200:
        raise APIError("GET", "%s:%d%s" % (host, port, path), status, body)
    return body


MAP_LINE = re.compile(r"cluster map epoch=(\d+): .*; brokers: ?(.*)$")
LEADER_LINE = re.compile(r"cluster: leader is (\S+) \(id (\d+) at (\S+)\)( \(self\))?")


class View:
    """One member's latest view: epoch, {name: state}, leader id, self-leader."""

    def __init__(self, epoch, brokers, leader_id, is_leader):
        self.epoch = epoch
        self.brokers = brokers
        self.leader_id = leader_id
        self.is_leader = is_leader

    def __repr__(self):
        return "View(epoch=%s, brokers=%s, leader_id=%s%s)" % (
            self.epoch, self.brokers, self.leader_id, ", self" if self.is_leader else "")


class Member:
    def __init__(self, cluster, name, join=None, secret_file=None, extra_args=(),
                 config_file=False, host="127.0.0.1", netns=None, amqp_host=None, env=None):
        self.cluster = cluster
        self.name = name
        self.host = host      # every address the broker listens on, but:
        self.amqp_host = amqp_host or host  # its AMQP listener's (IPv6 allowed)
        self.env = env        # the process environment (None: ours)
        self.netns = netns    # run inside this network namespace (tests/cluster/netlab.py)
        self.dir = os.path.join(cluster.dir, name)
        os.makedirs(self.dir)
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "quayd.log")
        self.amqp_port = free_port()
        self.cluster_port = free_port(udp_too=True)
        self.http_port = free_port() if cluster.has_http else None
        self.join = join
        self.secret_file = cluster.secret_file if secret_file is None else secret_file
        self.extra_args = list(extra_args)
        self.config_file = config_file
        self.proc = None
        self.started_at = None
        self.log_offset = 0

    @property
    def cluster_address(self):
        return "%s:%d" % (self.host, self.cluster_port)

    def options(self):
        """The cluster options as (name, value) pairs."""
        opts = [("name", self.name), ("cluster-listen", self.cluster_address)]
        if self.join:
            opts.append(("join", ",".join(m.cluster_address if isinstance(m, Member) else m
                                          for m in self.join)))
        if self.secret_file:
            opts.append(("cluster-secret-file", self.secret_file))
        return opts

    def argv(self):
        wrap = ["ip", "netns", "exec", self.netns] if self.netns else []
        listen = ("[%s]:%d" if ":" in self.amqp_host else "%s:%d") % (self.amqp_host,
                                                                     self.amqp_port)
        args = wrap + [quayd_path(), "--listen", listen,
                       "--data", self.data, "--log-level", os.environ.get("QUAY_LOG_LEVEL", "info")]
        if self.http_port:
            args += ["--http", "%s:%d" % (self.host, self.http_port)]
            if not self.host.startswith("127."):
                # A netns host (tests/cluster/netlab.py): a lab-private
                # network, where a plaintext API is fine.
                args += ["--http-allow-plaintext"]
        if self.config_file:
            path = os.path.join(self.dir, "quayd.conf")
            with open(path, "w") as f:
                f.write("# written by clustertest\n")
                for k, v in self.options():
                    f.write("%s = %s\n" % (k, v))
            args += ["--config", path]
        else:
            for k, v in self.options():
                args += ["--" + k, v]
        if not any(a.startswith("--auto-rebalance") for a in self.extra_args):
            # Tests place queues where they need them (a client on a broker
            # that is not the primary, above all): the controller must not
            # move them about unasked. Tests of rebalancing turn it on.
            args += ["--auto-rebalance", "off"]
        return args + self.extra_args

    def start(self, wait=True):
        """Starts the broker; with wait, returns once it logged that it is
        ready (every listener bound, the cluster member started). A first
        start that finds one of its ports taken is retried on fresh ones
        (see free_port); a restart keeps its addresses, which the other
        brokers know."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        may_move = self.proc is None
        for attempt in range(3):
            log = open(self.log_path, "ab")
            self.log_offset = log.tell()  # view() reads the current run only
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, env=self.env)
            log.close()
            _all_procs.append(self.proc)
            self.started_at = time.monotonic()
            if not wait or self.wait_accepting(port_taken_ok=may_move and attempt < 2):
                return self
            # What the run stored (a raft configuration with the old
            # address) belongs to a broker that never was: start afresh.
            shutil.rmtree(self.data, ignore_errors=True)
            self.amqp_port = free_port()
            self.cluster_port = free_port(udp_too=True)
            self.http_port = free_port() if self.http_port else None
        raise AssertionError("unreachable")

    def wait_accepting(self, timeout=20, port_taken_ok=False):
        """Waits until the current run logs "quayd ready" (it then accepts
        AMQP). A run that exits first fails the test with its log, unless
        port_taken_ok and a port it needed was taken: then False."""
        def ready():
            if self.proc.poll() is not None:
                return "exited"
            return "quayd ready" in self.log_text_bytes()[self.log_offset:].decode(
                "utf-8", "replace")
        if wait_until(ready, timeout, what="%s to be ready" % self.name) is True:
            return True
        text = self.log_text_bytes()[self.log_offset:].decode("utf-8", "replace")
        if port_taken_ok and "address already in use" in text:
            print("# %s: a port was taken, restarting on fresh ones" % self.name)
            return False
        raise AssertionError("%s exited at start with %s:\n%s" % (
            self.name, self.proc.returncode, text[-3000:]))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """kill -9; returns the monotonic time of the kill."""
        self.proc.send_signal(signal.SIGKILL)
        t = time.monotonic()
        self.proc.wait(10)
        return t

    def stop(self, timeout=10):
        """SIGTERM; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("%s did not exit within %d s of SIGTERM" % (self.name, timeout))

    def restart(self, wait=True):
        if self.alive():
            self.stop()
        return self.start(wait)

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_text_bytes(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def broker_id(self):
        """The stable id quayd stored in its data dir (None before the first start)."""
        try:
            with open(os.path.join(self.data, "cluster-id")) as f:
                return int(f.read().strip())
        except FileNotFoundError:
            return None

    def view(self):
        """The latest view in the log of the current run; None before it
        logged a leader or a map change."""
        text = self.log_text_bytes()[self.log_offset:].decode("utf-8", "replace")
        epoch, brokers, leader_id, is_leader = None, None, None, False
        for line in text.splitlines():
            m = MAP_LINE.search(line)
            if m:
                epoch = int(m.group(1))
                brokers = dict(item.split("=", 1) for item in m.group(2).split() if "=" in item)
                continue
            m = LEADER_LINE.search(line)
            if m:
                leader_id = int(m.group(2))
                is_leader = bool(m.group(4))
        if epoch is None and leader_id is None:
            return None
        return View(epoch, brokers or {}, leader_id, is_leader)

    def api_call(self, method, path, body=None, **kw):
        """A request to this member's management API as the cluster's API
        user: (status, parsed JSON)."""
        kw.setdefault("user", self.cluster.api_user[0])
        kw.setdefault("password", self.cluster.api_user[1])
        return api_call(self.host, self.http_port, method, path, body, **kw)

    def api_get(self, path, timeout=10, **kw):
        """GET path on this member's API as the cluster's API user: parsed
        JSON, or APIError."""
        kw.setdefault("user", self.cluster.api_user[0])
        kw.setdefault("password", self.cluster.api_user[1])
        return api_get(self.host, self.http_port, path, timeout=timeout, **kw)

    def api_cluster(self):
        """GET /api/cluster as a dict, or None if quayd does not serve it."""
        if not self.http_port or not self.alive():
            return None
        try:
            return self.api_get("/api/cluster", timeout=2)
        except Exception:
            return None

    def sanitizer_report(self):
        text = self.log_text()
        return [m for m in SANITIZER_MARKERS if m in text]

    def rss_kib(self):
        """The running process's VmRSS, in KiB."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(f.read().split("VmRSS:")[1].split()[0])


def metric(member, name):
    """A sample without labels from member's GET /metrics (31-metrics checks
    the format), e.g. quay_cluster_queue_moves_total: an int, or a float
    (quay_event_loop_lag_seconds)."""
    c = http.client.HTTPConnection(member.host, member.http_port, timeout=10)
    try:
        c.request("GET", "/metrics",
                  headers={"Authorization": api_authorization(*member.cluster.api_user)})
        r = c.getresponse()
        text = r.read().decode()
        assert r.status == 200, (r.status, text[:200])
    finally:
        c.close()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    assert m, name
    return int(m.group(1)) if m.group(1).isdigit() else float(m.group(1))


def queue_info(member, name):
    """The queue's entry in member's /api/queues; None if it has none or the
    broker cannot be reached (dead, cut off)."""
    try:
        return next((q for q in member.api_get("/api/queues", timeout=5) if q["name"] == name),
                    None)
    except OSError:
        return None


class Cluster:
    """A set of members sharing a secret; use as a context manager or call close()."""

    def __init__(self, secret=None, http=True):
        self.dir = tempfile.mkdtemp(prefix="quay-cluster-")
        self.secret_file = self.write_secret("secret", secret or os.urandom(32).hex())
        self.members = []
        self.failed = False
        helptext = subprocess.run([quayd_path(), "--help"], capture_output=True,
                                  text=True).stdout
        self.has_http = http and "--http" in helptext
        self.api_user = (API_USER, API_PASSWORD)  # the management API's login

    def write_secret(self, filename, text):
        path = os.path.join(self.dir, filename)
        with open(path, "w") as f:
            f.write(text)
        return path

    def users_file(self, user, password, tags="administrator"):
        """A --users file granting user (password hashed by quayd) the vhost
        "/" and the management tags (None: no tags word); returns its path.
        For clients that do not log in from loopback (guest is
        loopback-only). The harness's API calls log in as this user from
        then on (self.api_user): guest is not in the file."""
        pw = subprocess.run([quayd_path(), "--hash-password", password], capture_output=True,
                            text=True, check=True).stdout.strip()
        self.api_user = (user, password)
        return self.write_secret("users", "%s %s /%s\n" % (
            user, pw, " tags=" + tags if tags else ""))

    def add(self, name, start=True, **kw):
        m = Member(self, name, **kw)
        self.members.append(m)
        if start:
            m.start()
        return m

    def member(self, name):
        return next(m for m in self.members if m.name == name)

    def by_id(self, broker_id):
        return next((m for m in self.members if m.broker_id() == broker_id), None)

    def form(self, names, per=None, **kw):
        """Starts names[0] (it leads), then the others joining it, each with
        kw plus per(name) if given (Member options); waits until every
        broker's map shows them all up, their links are up and each has
        caught up with the map. Returns the members in order."""
        def options(name):
            return dict(kw, **(per(name) if per else {}))
        first = self.add(names[0], **options(names[0]))
        wait_until(lambda: len(self.leaders([first])) == 1, 15, what="%s to lead" % names[0])
        members = [first] + [self.add(n, join=[first], **options(n)) for n in names[1:]]
        expect = {m.name: "up" for m in members}
        wait_until(lambda: all(m.view() and m.view().brokers == expect for m in members), 30,
                   what="%d brokers up everywhere" % len(members))
        wait_until(lambda: all(m.log_text().count("is up") >= len(members) - 1 for m in members),
                   10, what="links up")
        # Caught up with the map: until then the HTTP API answers 503 and
        # connection.open waits.
        wait_until(lambda: all("caught up with the map" in m.log_text() for m in members), 10,
                   what="every broker caught up with the map")
        return members

    def leaders(self, among=None):
        """Live members whose own latest view says they lead."""
        out = []
        for m in among or self.members:
            if m.alive():
                v = m.view()
                if v and v.is_leader:
                    out.append(m)
        return out

    def close(self):
        problems = []
        for m in self.members:
            if m.alive():
                try:
                    rc = m.stop()
                    if rc != 0:
                        problems.append("%s exited %d after SIGTERM" % (m.name, rc))
                except AssertionError as e:
                    problems.append(str(e))
            for marker in m.sanitizer_report():
                problems.append("sanitizer report in %s's log (%r)" % (m.name, marker))
        if problems or self.failed:
            print("# cluster logs kept in %s" % self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return problems

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def connect_as(member, user, password, socket_timeout=5, **kw):
    """A pika BlockingConnection to member's AMQP port as user (no
    heartbeats, one attempt); kw: more pika.ConnectionParameters."""
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters(
        member.amqp_host, member.amqp_port, "/", pika.PlainCredentials(user, password),
        heartbeat=0, connection_attempts=1, socket_timeout=socket_timeout, **kw))


def broker_states(member):
    """{name: state} of the brokers in member's latest logged map ({} before one)."""
    v = member.view()
    return v.brokers if v else {}


def lab_trio(lab, cluster, extra_args):
    """Brokers a, b and c in the netlab hosts 1, 2 and 3 (a leads), formed
    with extra_args (Cluster.form: every map shows them all up)."""
    return cluster.form(["a", "b", "c"], extra_args=extra_args,
                        per=lambda n: dict(host=lab.ip("abc".index(n) + 1),
                                           netns=lab.ns("abc".index(n) + 1)))


def connect(member):
    """A pika BlockingConnection to member's AMQP port (no heartbeats)."""
    import pika
    return pika.BlockingConnection(pika.ConnectionParameters(
        member.amqp_host, member.amqp_port, heartbeat=0, blocked_connection_timeout=30))


def _traced_and_running(pid):
    """pid has a tracer and runs (gdb attached, set its breakpoint and let
    it go on)."""
    with open("/proc/%d/status" % pid) as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return fields["TracerPid"].strip() != "0" and not fields["State"].strip().startswith("t")


def kill_at(member, function):
    """gdb, attached to member's process, kills it (SIGKILL) the moment it
    calls function: a broker that dies at one chosen step. Returns the gdb
    process (its output says where; the caller kills it if the step never
    came) once the breakpoint is in place."""
    import shutil
    if shutil.which("gdb") is None:
        raise AssertionError("gdb is needed (scripts/setup.sh installs it)")
    gdb = subprocess.Popen(
        ["gdb", "-p", str(member.proc.pid), "-batch", "-nx", "-ex", "set pagination off",
         "-ex", "set confirm off", "-ex", "break " + function, "-ex", "continue", "-ex", "kill"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # (Attached: it stops the process, reads the symbols, continues it.)
    wait_until(lambda: gdb.poll() is None and _traced_and_running(member.proc.pid), 60,
               what="gdb attached to %s" % member.name, detail=lambda: gdb.poll())
    return gdb


def restart_without_quorum(member, other):
    """kill -9 and restart of member while other is stopped (SIGSTOP): of
    three brokers, no quorum while member is dead (if it leads Raft), so
    the map cannot mark it down."""
    os.kill(other.proc.pid, signal.SIGSTOP)
    try:
        member.kill()
        member.restart()
        time.sleep(0.5)
    finally:
        os.kill(other.proc.pid, signal.SIGCONT)


def publish_half_transient(ch, queue, n):
    """n messages "0", "1", ... to queue on channel ch (in confirm mode:
    each confirmed), the even ones transient, the odd ones persistent.
    Returns their bodies in order."""
    import pika
    bodies = [b"%d" % i for i in range(n)]
    for i, body in enumerate(bodies):
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=1 + i % 2))
    return bodies


def publish_persistent(member, queue, n, size=1024):
    """n persistent messages of size bytes to queue through member, each
    confirmed."""
    import pika
    c = connect(member)
    ch = c.channel()
    ch.confirm_delivery()
    body = b"x" * size
    persistent = pika.BasicProperties(delivery_mode=2)
    for _ in range(n):
        ch.basic_publish("", queue, body, properties=persistent)
    c.close()


def read_all(member, queue, redelivered=False, connect_with=None):
    """Every message left in queue, in order (basic.get with auto-ack via
    member, connected by connect_with(member) if given): the bodies, or
    (body, redelivered flag) pairs."""
    c = (connect_with or connect)(member)
    ch = c.channel()
    got = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        got.append((body, m.redelivered) if redelivered else body)
    c.close()
    return got


def declare_until(prefix, via, want, durable=True, connect_with=None, **args):
    """Declares queues prefix-0, prefix-1, ... (durable or not, arguments
    args) through member via (connected by connect_with(via) if given)
    until want(queue_info) holds for one; returns its name. The misses
    stay: placement spreads queues evenly, so the others must get theirs
    for a broker to get more."""
    conn = (connect_with or connect)(via)
    ch = conn.channel()
    try:
        for i in range(64):
            name = "%s-%d" % (prefix, i)
            ch.queue_declare(name, durable=durable, arguments=args)
            if want(queue_info(via, name)):
                return name
        raise AssertionError("no %s placed as wanted" % prefix)
    finally:
        conn.close()


def closer(get_cluster, *get_others):
    """A run() cleanup that closes the cluster get_cluster() returns (None: none
    was made), keeping its logs if a test failed; then what each of
    get_others() returns, if not None (a netlab.Lab)."""
    def cleanup(failed):
        problems = []
        cluster = get_cluster()
        if cluster is not None:
            cluster.failed = failed
            problems = cluster.close()
        for get in get_others:
            other = get()
            if other is not None:
                other.close()
        return problems
    return cleanup


# ---------------------------------------------------------------------------
# Runner: the one for every Python test (quaytest.py's run() wraps it)
# ---------------------------------------------------------------------------

_tests = []


def test(fn=None, timeout=None, default_timeout=90):
    """Register a test.  Use as @test or @test(timeout=60)."""
    def reg(f):
        f.timeout = timeout or default_timeout
        _tests.append(f)
        return f
    return reg(fn) if fn is not None else reg


class TestTimeout(Exception):
    pass


def _alarm(signum, frame_):
    raise TestTimeout("test timed out")


def run_tests(after_each=None, after_failure=None, cleanup=None, cleanup_label="cleanup"):
    """Runs the registered tests in order (or only those named on the command
    line), each under its alarm, printing `ok NAME (T)` or `FAIL NAME: why`;
    after_each() runs after a test that passed, still under its alarm (a
    failure there fails the test), after_failure() after one that failed.
    cleanup(failed) returns a list of problems, each counted as a failure.
    Returns (passed, failed)."""
    only = set(sys.argv[1:])
    signal.signal(signal.SIGALRM, _alarm)
    passed = failed = 0
    for t in _tests:
        if only and t.__name__ not in only:
            continue
        signal.alarm(t.timeout)
        t0 = time.time()
        try:
            t()
            if after_each is not None:
                after_each()
            signal.alarm(0)
            passed += 1
            print("ok %s (%.2fs)" % (t.__name__, time.time() - t0))
        except BaseException as e:
            signal.alarm(0)
            if isinstance(e, KeyboardInterrupt):
                raise
            failed += 1
            print("FAIL %s: %s: %s" % (t.__name__, type(e).__name__, e))
            traceback.print_exc(file=sys.stdout)
            if after_failure is not None:
                after_failure()
        sys.stdout.flush()
    if cleanup is not None:
        for problem in cleanup(failed > 0):
            failed += 1
            print("FAIL %s: %s" % (cleanup_label, problem))
    return passed, failed


def finish(passed, failed):
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


def run(cleanup=None):
    """Run the registered tests (run_tests), print the totals and exit 1 on
    any failure; cleanup(failed) returns a list of problems."""
    finish(*run_tests(cleanup=cleanup))
