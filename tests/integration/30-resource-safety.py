"""30-resource-safety: a client cannot make the broker hold memory it did not send,
nor keep what it held once it is gone (issue 17, "Resource safety").

Goal:
- a frame header reserves nothing either (200 connections holding 9 bytes
  of a 128 KiB frame each cost a few KiB apiece);
- a content header reserves nothing: 80 headers each declaring a 128 MiB
  body (4 connections x 20 channels, about 4 KB on the wire) leave the memory
  alarm off, the broker's memory estimate and RSS within a few MiB, and
  another connection's publisher confirmed at once; the same with body bytes
  trickled in (the slow variant); bodies that arrive in pieces of every size
  are delivered whole;
- a publisher blocked by an alarm is not read, but its close is still seen
  (FIN or RST): it is released (its exclusive queue, its half-received body),
  and the alarm its body raised clears, so other publishers are unblocked;
  one that stays connected with heartbeats on is kept (the kernel, which does
  read its heartbeats, vouches for it);
- channel numbers above the negotiated channel_max and connections beyond
  --max-handshaking that have not finished their handshake are refused.

Method: raw frames (quaytest's encoder) on sockets to a private quayd (or,
QUAY_TEST_MODE=cluster, a 3-broker cluster reached through a broker that is
no queue's primary: there the proxy assembles the messages); memory from
/api/overview and /proc/PID/status. Quay-only: against RabbitMQ
(QUAY_TEST_TARGET) each test prints "# skip".
"""

import contextlib
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F401,F403

MiB = 1024 * 1024
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
DECLARED = 128 * MiB           # the default --max-message-size: accepted


@contextlib.contextmanager
def own_broker(flags):
    """The body runs against a quayd (or cluster) started with flags and the
    management API; skipped against RabbitMQ. ASan's quarantine is capped,
    so that RSS measures the broker's own memory."""
    if is_rabbitmq():
        print("# skip on RabbitMQ: quay-only")
        yield None
        return
    env = dict(os.environ)
    asan = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "quarantine_size_mb=16"
    saved = quaytest._broker
    b = quaytest.Broker(flags, external_ok=False, env=env, http=True)
    quaytest._broker = b
    try:
        yield b
    except BaseException:
        print("---- the client's broker's log (tail) ----\n%s" % b.stderr_text()[-4000:])
        raise
    finally:
        quaytest._close_all()
        quaytest._broker = saved
        problems = b.stop()
        if problems:
            raise AssertionError("quayd %s: %s" % (" ".join(flags), "; ".join(problems)))


def rss(b):
    with open("/proc/%d/status" % b.proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def memory(b):
    """The client's broker's memory: (estimate in bytes, alarm on)."""
    m = b.api_get("/api/overview")["memory"]
    return m["used_bytes"], m["alarm"]


def connection_ids(b):
    return {c["id"] for c in b.api_get("/api/connections")}


def wait_for_methods(s, ids, timeout, accept=lambda m: True):
    """Reads methods (skipping others) until each of ids arrived once in
    that order and passed accept."""
    deadline = time.time() + timeout
    for want in ids:
        while True:
            m = read_method(s, max(0.01, deadline - time.time()))
            if m.id == want and accept(m):
                break


def blocking_connection(**kw):
    """A raw connection that announces the connection.blocked capability."""
    return raw_connection(capabilities={"connection.blocked": True}, **kw)


def start_publishes(socks, channels_each):
    """basic.publish + a content header declaring DECLARED bytes on channels
    1..channels_each of every socket: that many messages await bodies."""
    for s in socks:
        frames = b""
        for ch in range(1, channels_each + 1):
            if ch > 1:
                s.sendall(gen_channel_open(ch))
                expect_method(s, *CHANNEL_OPEN_OK, channel=ch)
            frames += gen_basic_publish(ch, "", "nowhere") + gen_content_header(ch, DECLARED)
        s.sendall(frames)


def confirmed_publisher(q):
    """A confirm-mode publisher on a connection of its own."""
    p = raw_connection()
    p.sendall(gen_confirm_select(1))
    expect_method(p, *CONFIRM_SELECT_OK)
    return p


def confirm_time(p, q, body=b"still served"):
    t0 = time.time()
    p.sendall(gen_publish(1, "", q, body))
    expect_method(p, *BASIC_ACK, timeout=5)
    return time.time() - t0


def check_probe_harmless(b, base_rss, base_used, p, q, what):
    used, alarm = memory(b)
    grew = rss(b) - base_rss
    print("# %s: memory estimate +%.2f MiB, RSS +%.2f MiB, alarm %s" % (
        what, (used - base_used) / MiB, grew / MiB, alarm))
    assert not alarm, "%s raised the memory alarm (estimate %.1f MiB)" % (what, used / MiB)
    assert used - base_used < 8 * MiB, "%s: memory estimate grew %.1f MiB" % (
        what, (used - base_used) / MiB)
    assert grew < 10 * MiB, "%s: RSS grew %.1f MiB" % (what, grew / MiB)
    took = confirm_time(p, q)
    assert took < 1.0, "another publisher's confirm took %.2f s" % took


# ------------------------------------------------------------ header probe

PROBE_FLAGS = ["--memory-high-watermark", "2GiB"]


@test(timeout=120)
def header_probe_reserves_no_memory():
    """80 content headers declaring 128 MiB each (10 GiB in all, 5 times the
    2 GiB mark) and no body: the alarm stays off, memory and RSS grow by less
    than a few MiB, another publisher is confirmed at once, and closing the
    probe leaves the broker as it was."""
    with own_broker(PROBE_FLAGS) as b:
        if b is None:
            return
        s = raw_connection()
        q = declare_queue(s)[0]
        p = confirmed_publisher(q)
        confirm_time(p, q)
        time.sleep(0.6)                   # a tick samples the heap
        base_rss, (base_used, _), base_ids = rss(b), memory(b), connection_ids(b)
        probes = [raw_connection() for _ in range(4)]
        start_publishes(probes, 20)
        time.sleep(1.0)                   # ticks: the alarm would be on by now
        check_probe_harmless(b, base_rss, base_used, p, q, "80 x 128 MiB headers")
        for x in probes:
            x.close()
        wait_until(lambda: connection_ids(b) == base_ids, 5, what="the probes to be gone")
        eq(memory(b)[1], False, "alarm after the probe")


@test(timeout=120)
def trickled_header_probe_holds_only_what_arrived():
    """The slow variant: the same 80 headers, then 1 KiB of body on every
    channel every 0.1 s for 3 s (2.4 MiB sent in all): the broker holds about
    what arrived, not what was declared."""
    with own_broker(PROBE_FLAGS) as b:
        if b is None:
            return
        s = raw_connection()
        q = declare_queue(s)[0]
        p = confirmed_publisher(q)
        confirm_time(p, q)
        time.sleep(0.6)
        base_rss, (base_used, _), base_ids = rss(b), memory(b), connection_ids(b)
        probes = [raw_connection() for _ in range(4)]
        start_publishes(probes, 20)
        chunk = b"t" * 1024
        for _ in range(30):
            for x in probes:
                x.sendall(b"".join(gen_body(ch, chunk) for ch in range(1, 21)))
            time.sleep(0.1)
        time.sleep(0.6)
        check_probe_harmless(b, base_rss, base_used, p, q, "80 x 128 MiB trickled")
        for x in probes:
            x.close()
        wait_until(lambda: connection_ids(b) == base_ids, 5, what="the probes to be gone")


def split_frames(ch, body, sizes):
    """Body frames for body cut in pieces of the given sizes, cycling."""
    out, i, k = [], 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        out.append(gen_body(ch, body[i:i + n]))
        i, k = i + n, k + 1
    return out


@test(timeout=120)
def bodies_arriving_in_pieces_are_delivered_whole():
    """Messages of 0 B .. 3 MiB whose body frames arrive one by one (each
    sent on its own, so the broker sees every piece separately), in pieces
    of 1 B to a whole frame, and ones sent in one write: each comes back
    byte for byte."""
    with own_broker(PROBE_FLAGS) as b:
        if b is None:
            return
        s = raw_connection()
        q = declare_queue(s)[0]
        cases = [(0, [1]), (1, [1]), (4095, [1000]), (4097, [4096, 1]), (70000, [7, 65536]),
                 (300000, [131064]), (3 * MiB + 5, [131064, 333, 99999]), (200000, None),
                 (262200, "dribble")]
        for n, (size, sizes) in enumerate(cases):
            body = bytes((n * 31 + i * 7) % 251 for i in range(size))
            if sizes is None:             # the fast path: everything in one write
                s.sendall(gen_publish(1, "", q, body))
            elif sizes == "dribble":      # whole frames, written 3,000 bytes at a time
                data = gen_publish(1, "", q, body)
                for i in range(0, len(data), 3000):
                    s.sendall(data[i:i + 3000])
                    time.sleep(0.001)
            else:
                s.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, size))
                for f in split_frames(1, body, sizes) if size > 0 else []:
                    s.sendall(f)
                    if len(f) < 4096:
                        time.sleep(0.001)
            got = basic_get(s, 1, q, no_ack=True)
            assert got is not None, "message %d (%d bytes) not delivered" % (n, size)
            eq(len(got["body"]), size, "size of message %d" % n)
            assert got["body"] == body, "message %d (%d bytes) corrupted" % (n, size)


@test(timeout=120)
def partial_frames_hold_what_arrived():
    """200 connections each send the header of a 128 KiB frame and one byte
    of it, then one more byte: the broker's memory estimate grows by a few
    KiB per connection (the bytes, a little room), not by the frames'
    declared sizes (26 MiB, 130 KiB each, before)."""
    with own_broker(PROBE_FLAGS) as b:
        if b is None:
            return
        time.sleep(0.6)
        base_used = memory(b)[0]
        socks = []
        for _ in range(200):
            x = raw_connection(channel=None)
            x.sendall(struct.pack(">BHI", FRAME_METHOD, 0, 131000) + b"x")
            socks.append(x)
        time.sleep(0.3)
        for x in socks:
            x.sendall(b"y")               # the read that would grow the room
        time.sleep(0.8)
        grew = memory(b)[0] - base_used
        print("# 200 partial frames: memory estimate +%.2f MiB" % (grew / MiB))
        assert grew < 8 * MiB, "200 partial frames grew the estimate %.1f MiB" % (grew / MiB)
        for x in socks:
            x.close()


# ------------------------------------------------------- blocked and vanished

@test(timeout=180)
def partial_body_of_a_vanished_blocked_client_is_released():
    """A publisher sends the body of a 126 MiB message until the memory alarm
    (a 96 MiB mark) is on and it is blocked mid-message, then vanishes: the
    broker notices although it no longer reads it, frees the partial body,
    the alarm clears, and a second publisher that the alarm blocked is
    unblocked and confirmed."""
    with own_broker(["--memory-high-watermark", "96MiB"]) as b:
        if b is None:
            return
        time.sleep(0.6)
        used, alarm = memory(b)
        assert not alarm and used < 48 * MiB, "broker starts at %.1f MiB" % (used / MiB)
        s = raw_connection()
        q = declare_queue(s)[0]
        a = blocking_connection()
        size = 126 * MiB
        a.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, size))
        a.setblocking(False)
        piece = 131064
        chunk, sent, pending = gen_body(1, b"m" * piece), 0, b""
        deadline = time.time() + 60
        while not memory(b)[1]:
            assert time.time() < deadline, "no alarm after %.1f MiB of body" % (sent / MiB)
            for _ in range(32):
                if not pending:
                    if sent + 2 * len(chunk) > size:
                        break             # never complete the message
                    pending = chunk
                try:
                    n = a.send(pending)
                except BlockingIOError:
                    break
                pending, sent = pending[n:], sent + n
            time.sleep(0.01)
        print("# alarm on after %.1f MiB of body" % (sent / MiB))
        # a second publisher: blocked while the alarm is on
        p = blocking_connection()
        p.sendall(gen_confirm_select(1))
        expect_method(p, *CONFIRM_SELECT_OK)
        p.sendall(gen_publish(1, "", q, b"blocks"))
        wait_for_methods(p, [CONNECTION_BLOCKED], 5)
        p.sendall(gen_publish(1, "", q, b"waits"))   # not read while blocked
        time.sleep(1.0)
        assert memory(b)[1], "the alarm cleared while the half-sent body was held"
        a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        a.close()                         # vanishes: RST, nothing read after it
        wait_for_methods(p, [CONNECTION_UNBLOCKED, BASIC_ACK], 10,
                         lambda m: m.id != BASIC_ACK or m.args.longlong() == 2)
        eq(memory(b)[1], False, "alarm after the client vanished")


TINY_MARK = ["--memory-high-watermark", "64KiB"]   # below any broker's heap: always on


def queue_names(b):
    return {x["name"] for x in b.api_get("/api/queues")}


def blocked_publisher(b, q, **kw):
    """A publisher that the (always on) alarm blocked, holding an exclusive
    queue: (socket, its connection id, its queue)."""
    before = connection_ids(b)
    a = blocking_connection(**kw)
    (cid,) = connection_ids(b) - before
    xq = declare_queue(a, 1, uniq("held"), exclusive=True)[0]
    a.sendall(gen_publish(1, "", q, b"x"))
    expect_method(a, *CONNECTION_BLOCKED, timeout=5)
    wait_until(lambda: any(c["id"] == cid and c["blocked"]
                           for c in b.api_get("/api/connections")), 5, what="blocked")
    return a, cid, xq


@test(timeout=120)
def blocked_client_that_closes_is_released():
    """With the alarm on, a blocked publisher (its channels, its exclusive
    queue) is released within a couple of seconds of closing its socket,
    whether it says goodbye with FIN or with RST; an idle connection that
    never published stays."""
    with own_broker(TINY_MARK) as b:
        if b is None:
            return
        time.sleep(0.6)
        assert memory(b)[1], "the alarm is not on"
        idle = raw_connection()
        base_ids = connection_ids(b)      # in a cluster, the other brokers' links too
        for rst in (False, True):
            s = raw_connection()
            q = declare_queue(s, exclusive=False)[0]
            a, cid, xq = blocked_publisher(b, q)
            assert xq in queue_names(b)
            if rst:
                a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            a.close()
            wait_until(lambda: cid not in connection_ids(b), 5,
                       what="the blocked connection to be released (%s)" %
                       ("RST" if rst else "FIN"))
            wait_until(lambda: xq not in queue_names(b), 5, what="its exclusive queue to go")
            s.close()
        eq(connection_ids(b), base_ids, "connections left (the idle one and links)")
        idle.sendall(gen_queue_declare(1, "", exclusive=True))
        expect_method(idle, *QUEUE_DECLARE_OK)


@test(timeout=120)
def blocked_client_with_heartbeats_is_kept():
    """heartbeat 1 s: a blocked publisher whose own heartbeats cannot be read
    (nothing of it is) is not timed out while its socket is alive, and is
    released once it closes."""
    with own_broker(TINY_MARK) as b:
        if b is None:
            return
        time.sleep(0.6)
        s = raw_connection()
        q = declare_queue(s, exclusive=False)[0]
        a, cid, _ = blocked_publisher(b, q, heartbeat=1)
        t_end = time.time() + 4
        while time.time() < t_end:        # our heartbeats go into the unread input
            a.sendall(gen_heartbeat())
            time.sleep(0.4)
        assert cid in connection_ids(b), "a live blocked client was timed out"
        a.close()
        wait_until(lambda: cid not in connection_ids(b), 5, what="release after close")


# ------------------------------------------------------------ handshakes

@test(timeout=60)
def connections_not_logged_in_are_capped_and_timed_out():
    """--max-handshaking 4: four sockets that only said hello hold the four
    slots, so a fifth is closed at once; one that logs in frees its slot
    (logged-in connections are not counted); the others are closed by
    --handshake-timeout 1500, after which new ones are served again."""
    with own_broker(["--max-handshaking", "4", "--handshake-timeout", "1500"]) as b:
        if b is None:
            return
        hello = []
        for _ in range(4):
            x = raw_socket()
            x.sendall(PROTOCOL_HEADER)
            expect_method(x, *CONNECTION_START)
            hello.append(x)
        t0 = time.time()
        extra = raw_socket()
        eq(expect_closed_socket(extra, timeout=2), b"", "the fifth, over the limit")
        # the first logs in: its slot is free again, and it is served
        x = hello.pop(0)
        x.sendall(gen_connection_start_ok())
        expect_method(x, *CONNECTION_TUNE)
        x.sendall(gen_tune_ok() + gen_open())
        expect_method(x, *CONNECTION_OPEN_OK)
        y = raw_socket()
        y.sendall(PROTOCOL_HEADER)
        expect_method(y, *CONNECTION_START)
        for z in hello + [y]:
            expect_closed_socket(z, timeout=5)
        waited = time.time() - t0
        assert waited >= 1.0, "closed after %.2f s, before the handshake timeout" % waited
        x.sendall(gen_channel_open(1))
        expect_method(x, *CHANNEL_OPEN_OK)
        for _ in range(4):
            raw_connection()


if __name__ == "__main__":
    run()
