"""10-limits: resource limits and flow control.

Goal: the memory alarm (connection.blocked / unblocked, a blocked
connection is not read, consumers keep draining, nothing confirmed is lost,
RSS stays near the mark), publishers that never read and consumers that
never read cannot make the broker buffer without bound or starve other
clients, and the configured limits (connections, channel_max, consumers per
channel, queues per vhost, message size) answer like RabbitMQ 3.10.

Method: every test starts its own quayd with the flags it needs (same way
as quaytest's fixture: free port, temp data dir, SIGTERM at the end, fail on
a sanitizer report or non-zero exit).  ASan's free-memory quarantine is
capped (ASAN_OPTIONS quarantine_size_mb=16) so that VmRSS measures the
broker's own buffering, not the sanitizer's.

Against RabbitMQ (QUAY_TEST_TARGET=host:port, a node with default config):
  QUAY_TEST_LIMITS_TARGET=host:port  a second node whose rabbitmq.conf has
      `max_message_size = 1024`, `connection_max = 5`, `channel_max = 4` and
      vhost limit `rabbitmqctl set_vhost_limits -p / '{"max-queues": 3}'`;
  QUAY_TEST_RMQCTL="command prefix"  runs rabbitmqctl against the default
      node (used to raise a memory alarm with set_vm_memory_high_watermark).
Tests for features RabbitMQ 3.10 lacks or implements only loosely
(consumers per channel, the exact connection limit) and all RSS assertions
run against quay only; they print "# skip" on RabbitMQ.  Observed
behaviour: RABBITMQ-NOTES.md, section "Limits and flow control".
"""

import contextlib
import os
import select
import shlex
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F401,F403

MiB = 1024 * 1024
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)


# ---------------------------------------------------------------- fixture

def limited_quayd(flags):
    """A private quayd (or, in cluster mode, cluster) started with flags;
    ASan's quarantine is capped so that RSS measures the broker's own
    buffering."""
    env = dict(os.environ)
    asan = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "quarantine_size_mb=16"
    return quaytest.Broker(flags, external_ok=False, env=env)


class External:
    def __init__(self, target):
        host, _, port = target.rpartition(":")
        self.host, self.port, self.external, self.proc = host or "127.0.0.1", int(port), True, None

    def stop(self):
        return []


class Skip(Exception):
    pass


@contextlib.contextmanager
def broker_with(flags, rabbit_target="default"):
    """Run the body against quayd started with `flags`, or (RabbitMQ mode)
    against QUAY_TEST_TARGET ("default") / QUAY_TEST_LIMITS_TARGET ("limits")
    / nothing (None: quay-only test, skipped)."""
    saved = quaytest._broker
    if is_rabbitmq():
        if rabbit_target is None:
            raise Skip("quay-only")
        if rabbit_target == "limits":
            t = os.environ.get("QUAY_TEST_LIMITS_TARGET")
            if not t:
                raise Skip("QUAY_TEST_LIMITS_TARGET not set")
            b = External(t)
        else:
            b = saved
    else:
        b = limited_quayd(flags)
    quaytest._broker = b
    try:
        yield b
    finally:
        quaytest._close_all()
        quaytest._broker = saved
        problems = b.stop() if b is not saved else []
        if problems:
            raise AssertionError("quayd %s: %s" % (" ".join(flags), "; ".join(problems)))


def skippable(fn):
    def wrapper():
        try:
            fn()
        except Skip as e:
            print("# skip %s on RabbitMQ: %s" % (fn.__name__, e))
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def proc_status(b, key, proc=None):
    """VmRSS/VmHWM of a private quayd (b's, or proc), in bytes."""
    pid = (proc or b.proc).pid
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no %s in /proc/%d/status" % (key, pid))


def holders(b, q):
    """The processes whose memory a test bounds: the broker, or in cluster
    mode the client's broker (a proxy) and the queue's primary."""
    if b.cluster is None:
        return [b.proc]
    primary = b.primary_of(q)
    assert primary is not None, "no primary for %s" % q
    return [b.proc] + ([primary.proc] if primary.proc is not b.proc else [])


def rmqctl(*args):
    prefix = os.environ.get("QUAY_TEST_RMQCTL")
    if not prefix:
        raise Skip("QUAY_TEST_RMQCTL not set")
    subprocess.run(shlex.split(prefix) + list(args), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)


def shared_queue(name=None, arguments=None):
    s = raw_connection()
    q = name or uniq("lim")
    declare_queue(s, 1, q, exclusive=False, arguments=arguments)
    return s, q


def delete_queue(q):
    s = raw_connection()
    s.sendall(gen_queue_delete(1, q))
    expect_method(s, *QUEUE_DELETE_OK)
    s.close()


# ---------------------------------------------------------------- flooding publisher

class Flooder:
    """Non-blocking raw-frame publisher in confirm mode.  Message i has a body
    of `size` bytes.  Tracks acks, nacks and
    connection.blocked / unblocked.  Message i (1-based) has body b"%010d" % i,
    i.e. its number is its confirm tag."""

    def __init__(self, q, total, size=1024, exchange="", mandatory=False, props=None):
        self.s = raw_connection()
        self.s.sendall(gen_confirm_select(1))
        expect_method(self.s, *CONFIRM_SELECT_OK)
        self.s.setblocking(False)
        self.q, self.total, self.size = q, total, size
        self.exchange, self.mandatory, self.props = exchange, mandatory, props
        self.queued = 0                  # messages encoded into self.out
        self.out = b""
        self.inbuf = b""
        self.acked, self.nacked = set(), set()
        self.acked_n = 0
        self.blocked_at = self.unblocked_at = None
        self.events = []

    def _encode(self, i):
        body = (b"%010d" % (i + 1)).ljust(self.size, b".")   # = confirm tag
        return gen_publish(1, self.exchange, self.q, body, self.props, self.mandatory)

    def _parse(self):
        while len(self.inbuf) >= 7:
            ftype, ch, size = struct.unpack(">BHI", self.inbuf[:7])
            if len(self.inbuf) < 8 + size:
                return
            payload, self.inbuf = self.inbuf[7:7 + size], self.inbuf[8 + size:]
            if ftype != FRAME_METHOD:
                continue
            m = Method(ch, payload)
            if m.id in (BASIC_ACK, BASIC_NACK):
                tag, multiple = m.args.longlong(), m.args.bit()
                tags = range(self.acked_n + 1, tag + 1) if multiple else [tag]
                target = self.acked if m.id == BASIC_ACK else self.nacked
                for t in tags:
                    if t not in self.acked and t not in self.nacked:
                        target.add(t)
                while self.acked_n + 1 in self.acked or self.acked_n + 1 in self.nacked:
                    self.acked_n += 1
            elif m.id == CONNECTION_BLOCKED:
                self.blocked_at = time.time()
                self.events.append(("blocked", time.time(), m.args.shortstr()))
            elif m.id == CONNECTION_UNBLOCKED:
                self.unblocked_at = time.time()
                self.events.append(("unblocked", time.time()))
            elif m.id in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                raise AssertionError("publisher got %r" % m)

    def confirmed(self):
        return len(self.acked) + len(self.nacked)

    def pump(self, seconds, until=lambda: False):
        """Publish/read for up to `seconds` or until `until()`."""
        deadline = time.time() + seconds
        while time.time() < deadline and not until():
            if len(self.out) < 65536 and self.queued < self.total:
                self.out += b"".join(self._encode(i) for i in
                                     range(self.queued, min(self.total, self.queued + 64)))
                self.queued = min(self.total, self.queued + 64)
            w = [self.s] if self.out else []
            r, w, _ = select.select([self.s], w, [], 0.02)
            if r:
                try:
                    data = self.s.recv(262144)
                except BlockingIOError:
                    data = None
                if data == b"":
                    raise AssertionError("publisher socket closed by broker")
                if data:
                    self.inbuf += data
                    self._parse()
            if w:
                try:
                    n = self.s.send(self.out[:262144])
                except BlockingIOError:
                    n = 0
                self.out = self.out[n:]
        return until()

    def done(self):
        return self.queued == self.total and not self.out and self.confirmed() >= self.total


class Drainer(threading.Thread):
    """A consumer on its own connection (no-ack) recording message numbers."""

    def __init__(self, q):
        super().__init__(daemon=True)
        self.s = raw_connection()
        self.s.sendall(gen_basic_consume(1, q, "drain", no_ack=True))
        expect_method(self.s, *BASIC_CONSUME_OK)
        self.seen = set()
        self.count = 0
        self.stop = False
        self.error = None

    def run(self):
        # own buffered parser: a timeout must never lose half a frame
        buf, want_body = b"", False
        try:
            self.s.setblocking(False)
            while not self.stop:
                r, _, _ = select.select([self.s], [], [], 0.2)
                if not r:
                    continue
                data = self.s.recv(262144)
                if not data:
                    raise AssertionError("consumer socket closed by broker")
                buf += data
                while len(buf) >= 7:
                    ftype, ch, size = struct.unpack(">BHI", buf[:7])
                    if len(buf) < 8 + size:
                        break
                    payload, buf = buf[7:7 + size], buf[8 + size:]
                    if ftype == FRAME_METHOD:
                        m = Method(ch, payload)
                        if m.id != BASIC_DELIVER:
                            raise AssertionError("consumer got %r" % m)
                        want_body = True
                    elif ftype == FRAME_BODY and want_body:
                        self.seen.add(int(payload[:10]))
                        self.count += 1
                        want_body = False
        except Exception as e:  # noqa: BLE001
            self.error = e


# ------------------------------------------------------------------ disk alarm

@test(timeout=60)
@skippable
def disk_alarm_blocks_publishers_but_not_consumers():
    """--disk-free-limit above any disk's free space: the disk alarm is on from
    the first sample; a publisher gets connection.blocked "low on disk" and is
    not read; a connection that only consumes is still served."""
    with broker_with(["--disk-free-limit", "1000000000GB"], None):
        time.sleep(1.5)                   # the disk is sampled once a second
        s, q = shared_queue()
        f = Flooder(q, 10000, 1024)
        assert f.pump(10, lambda: f.blocked_at is not None), \
            "no connection.blocked (%d confirmed)" % f.confirmed()
        eq(f.events[0][2], "low on disk", "connection.blocked reason")
        f.pump(0.5)
        before = f.confirmed()
        f.pump(1.5)
        eq(f.confirmed(), before, "confirms while blocked (publishes were read)")
        # a consumer-only connection is served
        s.sendall(gen_queue_declare(1, q, passive=True))
        m = expect_method(s, *QUEUE_DECLARE_OK, timeout=2)
        m.args.shortstr()
        eq(m.args.long(), before, "queued messages = confirmed ones")
        got = basic_get(s, 1, q, no_ack=True)
        assert got is not None or before == 0


# ---------------------------------------------------------------- memory alarm

# The product's bound (bench/ measures it on the release build) is 1.2x the
# mark. Under AddressSanitizer every allocation carries redzones, shadow
# memory and a quarantine, which the broker's own accounting cannot see, so
# a sanitized quayd is held to a looser (still fixed) bound.
SANITIZED = os.environ.get("QUAY_SANITIZED") in ("1", "ON", "true")
RSS_BOUND = 2.0 if SANITIZED else 1.2
# What AddressSanitizer keeps of freed memory (limited_quayd caps its
# quarantine at 16 MiB), on top of any bound: a message whose body arrives
# across two reads is moved once as it grows, and the block it leaves sits
# in the quarantine, which a release build gives back at once. (Without
# it the memory alarm's peak under ASan reached 2.0x the mark to within
# 0.5 MiB on a loaded CI machine. The release build's bound, 1.2x, is the
# product's; bench/ measures it.)
QUARANTINE = 16 * MiB if SANITIZED else 0


@test(timeout=240)
@skippable
def memory_alarm_blocks_flooding_publisher_and_drains_without_loss():
    """Memory alarm: publisher gets connection.blocked, is not read, RSS stays
    under 1.2 x mark; a consumer drains; unblocked arrives; nothing confirmed lost."""
    mark = 64 * MiB
    with broker_with(["--memory-high-watermark", "64MiB"], "default") as b:
        rabbit = is_rabbitmq()
        if rabbit:
            rmqctl("set_vm_memory_high_watermark", "0.0000001")
        try:
            s, q = shared_queue()
            # One process's peak against the mark; a clustered broker starts
            # bigger (the map, its links), so there its growth is measured.
            procs = [] if rabbit else holders(b, q)
            base = {p.pid: proc_status(b, "VmRSS", p) if b.cluster else 0 for p in procs}
            total = 120000          # 117 MiB of bodies: more than the mark
            f = Flooder(q, total, 1024)
            assert f.pump(90, lambda: f.blocked_at is not None), \
                "no connection.blocked after %d publishes (%d confirmed)" % (f.queued, f.confirmed())
            eq(f.events[0][2], "low on memory", "connection.blocked reason")
            # a blocked connection is not read: confirms stop
            f.pump(1.0)
            before = f.confirmed()
            f.pump(1.5)
            eq(f.confirmed(), before, "confirms while blocked (publishes were read)")
            assert f.unblocked_at is None
            for p in procs:
                hwm = proc_status(b, "VmHWM", p) - base[p.pid]
                print("# blocked: VmHWM +%.1f MiB (pid %d), mark %d MiB" % (hwm / MiB, p.pid,
                                                                         mark / MiB))
                assert hwm < RSS_BOUND * mark + QUARANTINE, "VmHWM %.1f MiB >= %.1f x %d MiB%s" % (
                    hwm / MiB, RSS_BOUND, mark / MiB, " + quarantine" if QUARANTINE else "")
            # another connection that does not publish is still served
            s.sendall(gen_queue_declare(1, q, passive=True))
            m = expect_method(s, *QUEUE_DECLARE_OK, timeout=2)
            m.args.shortstr()
            in_queue = m.args.long()
            assert in_queue >= before - 64, "queue has %d, confirmed %d" % (in_queue, before)
            d = Drainer(q)
            d.start()
            if rabbit:
                wait_until(lambda: d.count > 0 or in_queue == 0, 10, what="draining")
                rmqctl("set_vm_memory_high_watermark", "0.4")
            assert f.pump(30, lambda: f.unblocked_at is not None), \
                "no connection.unblocked while the consumer drained (%d consumed)" % d.count
            assert f.pump(150, f.done), "publisher did not complete: %d/%d confirmed" % (
                f.confirmed(), total)
            eq(f.nacked, set(), "nacked publishes")
            wait_until(lambda: d.seen >= f.acked or d.error, 60, 0.1,
                       what="consumer to receive every confirmed message (%d of %d so far, "
                       "error %r)" % (d.count, len(f.acked), d.error))
            d.stop = True
            d.join(5)
            assert d.error is None, d.error
            missing = f.acked - d.seen
            assert not missing, "%d confirmed messages lost, e.g. %r" % (
                len(missing), sorted(missing)[:5])
            for p in procs:
                hwm = proc_status(b, "VmHWM", p) - base[p.pid]
                assert hwm < RSS_BOUND * mark + QUARANTINE, "VmHWM %.1f MiB >= %.1f x mark%s" % (
                    hwm / MiB, RSS_BOUND, " + quarantine" if QUARANTINE else "")
            delete_queue(q)
        finally:
            if rabbit:
                rmqctl("set_vm_memory_high_watermark", "0.4")


# ---------------------------------------------------------------- never-reading clients

def round_trip(s, q, i):
    t0 = time.time()
    s.sendall(gen_publish(1, "", q, b"rt%d" % i))
    g = basic_get(s, 1, q, no_ack=True)
    eq(g and g["body"], b"rt%d" % i, "round-trip message")
    return time.time() - t0


@test(timeout=150)
@skippable
def publishers_that_never_read_do_not_grow_memory_or_starve_others():
    """20 confirm-mode publishers of mandatory unroutable 4 KiB messages that
    never read: RSS stays bounded and another client is served in < 1 s."""
    with broker_with([], "default") as b:
        rabbit = is_rabbitmq()
        probe = raw_connection()
        pq = declare_queue(probe)[0]
        round_trip(probe, pq, 0)
        base = None if rabbit else proc_status(b, "VmRSS")
        body = b"u" * 4096
        one = gen_publish(1, "", "nowhere-%d" % os.getpid(), body, mandatory=True) * 16
        floods = []
        for _ in range(20):
            s = raw_connection()
            s.sendall(gen_confirm_select(1))
            expect_method(s, *CONFIRM_SELECT_OK)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setblocking(False)
            floods.append([s, 0])
        cap = 48 * MiB          # per publisher: 960 MiB offered in all
        worst, peak, i = 0.0, 0, 0
        t_start = time.time()
        t_end = t_start + 20
        mid = None
        while time.time() < t_end:
            _, w, _ = select.select([], [f[0] for f in floods if f[1] < cap], [], 0.05)
            for f in floods:
                if f[0] in w:
                    try:
                        f[1] += f[0].send(one)
                    except (BlockingIOError, ConnectionError):
                        pass
            i += 1
            if i % 10 == 0:
                worst = max(worst, round_trip(probe, pq, i))
                if not rabbit:
                    peak = max(peak, proc_status(b, "VmRSS"))
                    if mid is None and time.time() > t_start + 10:
                        mid = (peak, sum(f[1] for f in floods))
        written = sum(f[1] for f in floods)
        assert worst < 1.0, "round trip took %.2f s during the flood" % worst
        if not rabbit:
            peak = max(peak, proc_status(b, "VmRSS"))
            grew, late = peak - base, peak - mid[0]
            # bounded: nothing more accumulates in the second half of the flood
            # while the publishers keep trying to write, and the total stays far
            # below what buffering every basic.return would take
            assert late < 16 * MiB and grew < 256 * MiB, (
                "VmRSS grew %.1f MiB (%.1f MiB in the last 10 s) while 20 non-reading "
                "publishers wrote %.1f MiB (%.1f MiB in the last 10 s)" % (
                    grew / MiB, late / MiB, written / MiB, (written - mid[1]) / MiB))
        print("# flood wrote %.1f MiB, worst round trip %.3f s%s" % (
            written / MiB, worst, "" if rabbit else ", RSS +%.1f MiB" % ((peak - base) / MiB)))
        for f in floods:
            f[0].close()


@test(timeout=240)
@skippable
def slow_consumer_leaves_undelivered_messages_in_the_queue():
    """A no-ack consumer that never reads: a 200 MB publish stays (mostly) in
    the queue, not in an output buffer; RSS ~ message bytes; nothing is lost."""
    with broker_with([], "default") as b:
        rabbit = is_rabbitmq()
        # In a cluster a backup holds a second copy of the queue, by design
        # (and the client's broker may be it): this is about output buffers.
        s, q = shared_queue(arguments=None if rabbit else {"x-quay-backups": 0})
        procs = [] if rabbit else holders(b, q)
        base = {p.pid: proc_status(b, "VmRSS", p) for p in procs}
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect((broker().host, broker().port))
        track(slow)
        handshake(slow)
        slow.sendall(gen_channel_open(1))
        expect_method(slow, *CHANNEL_OPEN_OK)
        slow.sendall(gen_basic_consume(1, q, "slow", no_ack=True))
        expect_method(slow, *BASIC_CONSUME_OK)
        size, total = 8192, 25600          # 200 MiB of bodies
        f = Flooder(q, total, size)
        assert f.pump(180, f.done), "publish did not complete: %d/%d confirmed" % (
            f.confirmed(), total)
        eq(f.nacked, set())
        in_queue = declare_queue(s, 1, q, passive=True)[1]
        pushed = total - in_queue
        assert pushed * size <= 16 * MiB, (
            "%d of %d messages (%.1f MiB) left the queue for a consumer that reads nothing"
            % (pushed, total, pushed * size / MiB))
        for p in procs:
            rss = proc_status(b, "VmRSS", p) - base[p.pid]
            hwm = proc_status(b, "VmHWM", p) - base[p.pid]
            print("# %d messages in queue, RSS +%.1f MiB, HWM +%.1f MiB for %.1f MiB (pid %d)" % (
                in_queue, rss / MiB, hwm / MiB, total * size / MiB, p.pid))
            assert hwm < 1.5 * total * size + QUARANTINE, (
                "VmHWM grew %.1f MiB for %.1f MiB of messages" % (hwm / MiB, total * size / MiB))
        # now read: every message arrives, in order
        slow.settimeout(10)
        got = 0
        while got < total:
            d = read_delivery(slow, timeout=20)
            eq(int(d["body"][:10]), got + 1, "delivery order")
            got += 1
        f.s.setblocking(True)
        delete_queue(q)


# ---------------------------------------------------------------- configured limits

@test(timeout=60)
@skippable
def max_connections_refuses_the_sixth_by_closing_it():
    """--max-connections 5: the 6th TCP connection is closed without a frame;
    the 5 keep working; after one closes a new one is accepted. (quay only:
    RabbitMQ 3.10's connection_max is ranch's per-supervisor limit.)"""
    with broker_with(["--max-connections", "5"], None):
        # the runner's between-test check needs a free slot: keep 5 only here
        conns = [raw_connection() for _ in range(5)]
        extra = raw_socket()
        extra.sendall(PROTOCOL_HEADER)
        got = expect_closed_socket(extra, timeout=3)
        eq(got, b"", "bytes sent to the refused connection")
        for c in conns:
            declare_queue(c)
        conns[0].close()
        time.sleep(0.3)
        s = raw_connection()
        declare_queue(s)
        extra2 = raw_socket()
        extra2.sendall(PROTOCOL_HEADER)
        eq(expect_closed_socket(extra2, timeout=3), b"")


@test
@skippable
def channel_max_is_offered_and_enforced():
    """--channel-max 4 / channel_max = 4: tune offers 4; a 5th open channel
    -> connection.close 530 (RabbitMQ, whose channel numbers are free) or,
    on quay, which keeps numbers within 1..channel_max, channel 5 -> 504;
    tune-ok above 4 -> silent close."""
    with broker_with(["--channel-max", "4"], "limits"):
        s = raw_socket()
        info = handshake(s, channel_max=0)
        eq(info["tune"][0], 4, "tune channel_max")
        rabbit = is_rabbitmq()
        for ch in (1, 2, 3, 65535 if rabbit else 4):
            s.sendall(gen_channel_open(ch))
            expect_method(s, *CHANNEL_OPEN_OK, channel=ch)
        s.sendall(gen_channel_open(7 if rabbit else 5))
        eq(expect_close(s, connection=True),
           (NOT_ALLOWED, "NOT_ALLOWED - number of channels opened (4) has reached the "
            "negotiated channel_max (4)", 0, 0) if rabbit else
           (CHANNEL_ERROR, "CHANNEL_ERROR - channel 5 is above the negotiated channel_max (4)",
            0, 0))
        # client asks for more than offered
        s = raw_socket()
        s.sendall(PROTOCOL_HEADER)
        expect_method(s, *CONNECTION_START)
        s.sendall(gen_connection_start_ok())
        expect_method(s, *CONNECTION_TUNE)
        s.sendall(gen_tune_ok(10, 131072, 0) + gen_open())
        eq(expect_closed_socket(s, timeout=6), b"", "reply to tune-ok channel_max 10 > 4")


@test
@skippable
def max_consumers_per_channel_third_consume_is_506():
    """--max-consumers 2: 3rd basic.consume on a channel -> channel.close 506
    (quay only: RabbitMQ 3.10 has no consumer_max_per_channel)."""
    with broker_with(["--max-consumers", "2"], None):
        s = raw_connection()
        q = declare_queue(s)[0]
        for tag in ("c1", "c2"):
            s.sendall(gen_basic_consume(1, q, tag))
            expect_method(s, *BASIC_CONSUME_OK)
        # 506 resource-error is a connection-level ("hard") code in AMQP 0-9-1;
        # RabbitMQ turns every hard error raised in a channel into connection.close
        s.sendall(gen_basic_consume(1, q, "c3"))
        eq(expect_close(s, connection=True),
           (RESOURCE_ERROR, "RESOURCE_ERROR - consumer limit 2 reached", 60, 20))
        # the limit is per channel; a cancel frees a slot
        s = raw_connection()
        q = declare_queue(s)[0]
        s.sendall(gen_channel_open(2))
        expect_method(s, *CHANNEL_OPEN_OK)
        for ch, tag in ((1, "a1"), (1, "a2"), (2, "d1"), (2, "d2")):
            s.sendall(gen_basic_consume(ch, q, tag))
            expect_method(s, *BASIC_CONSUME_OK)
        s.sendall(gen_method(2, 60, 30, shortstr("d1") + bits(False)))
        expect_method(s, *BASIC_CANCEL_OK)
        s.sendall(gen_basic_consume(2, q, "d3"))
        expect_method(s, *BASIC_CONSUME_OK)


@test
@skippable
def max_queues_per_vhost_fourth_declare_is_406():
    """--max-queues 3 / vhost max-queues 3: the 4th queue.declare -> 406;
    redeclaring an existing queue is fine; deleting one frees a slot."""
    with broker_with(["--max-queues", "3"], "limits"):
        s = raw_connection()
        names = [uniq("mq") for _ in range(4)]
        try:
            for n in names[:3]:
                declare_queue(s, 1, n, exclusive=False)
            declare_queue(s, 1, names[0], exclusive=False)           # redeclare: ok
            declare_queue(s, 1, names[1], passive=True)
            s.sendall(gen_queue_declare(1, names[3]))
            eq(expect_close(s, connection=False),
               (PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot declare queue '%s': queue "
                "limit in vhost '/' (3) is reached" % names[3], 50, 10))
            s.sendall(gen_channel_open(2))
            expect_method(s, *CHANNEL_OPEN_OK)
            s.sendall(gen_queue_delete(2, names[2]))
            expect_method(s, *QUEUE_DELETE_OK)
            declare_queue(s, 2, names[3], exclusive=False)
        finally:
            for n in names:
                delete_queue(n)


@test
@skippable
def max_message_size_rejects_larger_bodies_with_406():
    """--max-message-size 1024 / max_message_size = 1024: 1024 accepted,
    1025 and 2048 -> channel.close 406 with RabbitMQ's text."""
    with broker_with(["--max-message-size", "1024"], "limits"):
        s = raw_connection()
        q = declare_queue(s)[0]
        s.sendall(gen_confirm_select(1))
        expect_method(s, *CONFIRM_SELECT_OK)
        s.sendall(gen_publish(1, "", q, b"x" * 1024))
        expect_method(s, *BASIC_ACK)
        for size, rk in ((1025, q), (2048, q), (2048, "nowhere")):
            s.sendall(gen_publish(1, "", rk, b"x" * size))
            eq(expect_close(s, connection=False),
               (PRECONDITION_FAILED, "PRECONDITION_FAILED - message size %d is larger than "
                "configured max size 1024" % size, 60, 40), "publish of %d bytes" % size)
            s.sendall(gen_channel_open(1))
            expect_method(s, *CHANNEL_OPEN_OK)
        eq(declare_queue(s, 1, q, passive=True)[1], 1)


if __name__ == "__main__":
    run()
