"""39-large-bodies: large bodies read straight into their message arrive
intact, whatever way their bytes come (issue 18, item 2).

Goal: a body frame whose header is in but most of whose payload is not is
taken in parts and the rest read straight into the message
(broker/connection_body.c, conn_sink). Every way the bytes can come must
give the same message, byte for byte (SHA-256 of each body, end to end):
- bodies of 16 KiB .. 3 MiB cut in frames of many sizes, with frame_max
  4 KiB, 128 KiB and 1 MiB, written whole, frame by frame, or cut at
  awkward places (inside a frame header, right before the end octet);
- a body that arrives a byte at a time, slowly;
- a wrong end octet after a split frame is still RabbitMQ's 501;
- a connection closed in the middle of a body is released (no leak under
  ASan, the memory estimate back where it was), and so is one the broker
  closes (a shutdown) while it reads a body straight into its message;
- a body above --max-message-size is refused as before (406, channel
  closed), its frames discarded, and the connection goes on;
- a message routed to several queues (fanout) is delivered intact from
  each of them, by pika consumers.

Method: raw frames (quaytest's encoder) and pika, on one broker or
(QUAY_TEST_MODE=cluster) a 3-broker cluster reached through a broker that
is no queue's primary, so every body is also forwarded to the primary and
replicated to its backup; in that mode the last test kills the primary
and reads the messages back from the promoted backup.
"""

import hashlib
import os
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F401,F403

KiB = 1024
MiB = 1024 * KiB


def body_of(size, seed):
    """A body no two of which are alike, cheap to make at MiB sizes."""
    block = hashlib.sha256(b"%d/%d" % (seed, size)).digest() * 128  # 4 KiB
    reps = size // len(block) + 1
    return (block * reps)[:size]


def digest(b):
    return hashlib.sha256(b).hexdigest()


def frames_of(ch, body, sizes):
    """Body frames for body cut in pieces of the given sizes, cycling."""
    out, i, k = [], 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        out.append(gen_body(ch, body[i:i + n]))
        i, k = i + n, k + 1
    return out


def send_in_cuts(s, data, cuts):
    """Writes data in pieces ending at the given offsets, with a pause after
    each, so the broker reads each piece on its own."""
    last = 0
    for c in sorted(set(x for x in cuts if 0 < x < len(data))):
        s.sendall(data[last:c])
        time.sleep(0.005)
        last = c
    s.sendall(data[last:])


def get_intact(s, q, body, what):
    got = basic_get(s, 1, q, no_ack=True)
    assert got is not None, "%s: not delivered" % what
    eq(len(got["body"]), len(body), "%s: size" % what)
    assert digest(got["body"]) == digest(body), "%s: corrupted" % what


def own_broker(flags):
    """A broker (or cluster) with flags, or None against RabbitMQ."""
    if is_rabbitmq():
        print("# skip on RabbitMQ: quay's options")
        return None
    return quaytest.Broker(flags, external_ok=False, http=True)


def connect_to(b, **kw):
    s = socket.create_connection((b.host, b.port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    info = handshake(s, **kw)
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)
    return s, info


def publish_ways(s, q, frame_max, sizes, seed):
    """Publishes a message per (size, way) and reads each back."""
    payload_max = frame_max - 8
    n = 0
    for size in sizes:
        for way in ("whole", "frame by frame", "cut", "mixed frames"):
            n += 1
            body = body_of(size, seed + n)
            head = gen_basic_publish(1, "", q) + gen_content_header(1, size)
            if way == "mixed frames":
                pieces = [payload_max, 7, payload_max // 3 + 1, 17 * KiB]
                frames = frames_of(1, body, [max(1, min(p, payload_max)) for p in pieces])
            else:
                frames = frames_of(1, body, [payload_max])
            data = head + b"".join(frames)
            if way == "whole":
                s.sendall(data)
            elif way in ("frame by frame", "mixed frames"):
                s.sendall(head)
                for f in frames:
                    s.sendall(f[:20])      # the header and a little: the rest is sunk
                    time.sleep(0.002)
                    s.sendall(f[20:])
            else:
                # inside the first body frame's header, in its payload,
                # and right before its end octet
                first = len(head)
                f0 = len(frames[0])
                send_in_cuts(s, data, [first + 3, first + 7, first + 9000, first + f0 - 1,
                                       first + f0, first + f0 + 2])
            get_intact(s, q, body, "%d bytes, frame_max %d, %s" % (size, frame_max, way))


@test(timeout=180)
def bodies_in_frames_of_every_size_arrive_intact():
    """frame_max 4 KiB, 128 KiB and 1 MiB (the broker allows 1 MiB here);
    bodies just under and over the split threshold, 64 KiB, several frames
    and 3 MiB; each written four ways."""
    b = own_broker(["--frame-max", str(MiB)])
    if b is None:
        return
    try:
        for frame_max in (4096, 131072, MiB):
            s, info = connect_to(b, frame_max=frame_max)
            eq(info["frame_max"], frame_max, "negotiated frame_max")
            q = declare_queue(s)[0]
            sizes = [16 * KiB - 1, 16 * KiB + 17, 64 * KiB, 200000]
            if frame_max >= 131072:
                sizes.append(3 * MiB + 5)
            publish_ways(s, q, frame_max, sizes, frame_max)
            s.close()
    finally:
        problems = b.stop()
    assert not problems, problems


@test(timeout=180)
def a_body_arriving_a_byte_at_a_time_arrives_intact():
    """A 20 KiB body frame written one byte at a time for its header and
    first 200 bytes, then 97 bytes at a time, with pauses; then a second
    message on the same connection written whole."""
    s = raw_connection()
    q = declare_queue(s)[0]
    body = body_of(20 * KiB, 7)
    data = gen_basic_publish(1, "", q) + gen_content_header(1, len(body)) + gen_body(1, body)
    start = len(data) - len(body) - 8
    s.sendall(data[:start])
    for i in range(start, start + 207):
        s.sendall(data[i:i + 1])
        time.sleep(0.001)
    for i in range(start + 207, len(data), 97):
        s.sendall(data[i:i + 97])
        time.sleep(0.0005)
    get_intact(s, q, body, "trickled")
    second = body_of(100 * KiB, 8)
    s.sendall(gen_publish(1, "", q, second))
    get_intact(s, q, second, "after the trickle")


@test(timeout=60)
def a_wrong_end_octet_after_a_split_frame_is_a_frame_error():
    s = raw_connection()
    q = declare_queue(s)[0]
    body = b"x" * (64 * KiB)  # printable: the reply text quotes 64 octets
    s.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, len(body)))
    s.sendall(struct.pack(">BHI", FRAME_BODY, 1, len(body)) + body[:100])
    time.sleep(0.05)
    s.sendall(body[100:])
    time.sleep(0.05)
    s.sendall(b"\x00")
    code, text = expect_close(s, connection=True)[:2]
    eq(code, FRAME_ERROR, "reply code")
    assert "invalid_frame_end_marker" in text, text


def memory_estimate(b):
    return b.api_get("/api/overview")["memory"]["used_bytes"]


@test(timeout=120)
def a_connection_closed_mid_body_is_released():
    """Ten connections each send part of a 3 MiB body (a whole first frame
    and part of the second, or part of the first) and close; one sends a
    frame header only. The broker's memory estimate comes back (under
    ASan: no leak at exit) and a whole message still goes through."""
    b = own_broker([])
    if b is None:
        return
    try:
        s, _ = connect_to(b)
        q = declare_queue(s, exclusive=False)[0]
        time.sleep(0.5)
        base = memory_estimate(b)
        for k in range(10):
            x, _ = connect_to(b)
            body = body_of(3 * MiB, 100 + k)
            x.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, len(body)))
            frame = gen_body(1, body[:131064])
            if k % 2:
                x.sendall(frame)          # the first frame whole, then part of the next
                frame = gen_body(1, body[131064:2 * 131064])
            x.sendall(frame[:9000])
            time.sleep(0.01)
            x.sendall(frame[9000:60000])
            time.sleep(0.01)
            x.close()
        x, _ = connect_to(b)
        x.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, 10 * MiB))
        x.sendall(struct.pack(">BHI", FRAME_BODY, 1, 131064))
        time.sleep(0.05)
        x.close()
        wait_until(lambda: memory_estimate(b) < base + 4 * MiB, 10,
                   what="the half-received bodies released")
        whole = body_of(2 * MiB, 99)
        s.sendall(gen_publish(1, "", q, whole))
        get_intact(s, q, whole, "after the aborted ones")
        s.close()
    finally:
        problems = b.stop()
    assert not problems, problems


@test(timeout=60)
def a_shutdown_in_the_middle_of_a_body_releases_it():
    """SIGTERM while a body frame is being read straight into its message:
    the connection gets 320 at once, its message is released and the read
    into it cancelled (the broker reads nothing more from it), and quayd
    exits 0 with no sanitizer report (a write into the freed message, or a
    leak, would show). One broker only (the signal goes to the client's
    broker)."""
    if quaytest.CLUSTERED:
        print("# skip: one broker only")
        return
    b = own_broker([])
    if b is None:
        return
    try:
        s, _ = connect_to(b)
        q = declare_queue(s)[0]
        body = body_of(200000, 21)
        frame = gen_body(1, body[:131064])
        s.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, len(body)) + frame[:5000])
        time.sleep(0.1)
        b.proc.send_signal(signal.SIGTERM)
        code = expect_close(s, connection=True, send_close_ok=False)[0]
        eq(code, CONNECTION_FORCED, "reply code")
        try:
            s.sendall(frame[5000:])       # not read any more: it may be refused
        except OSError:
            pass
        expect_closed_socket(s)
        b.proc.wait(10)
        eq(b.proc.returncode, 0, "quayd's exit status")
    finally:
        # (stop() finds it gone: the exit status was checked above)
        problems = [p for p in b.stop() if "died during the tests (exit 0)" not in p]
    assert not problems, problems


@test(timeout=60)
def a_body_over_the_size_limit_is_refused_and_the_connection_goes_on():
    b = own_broker(["--max-message-size", "100000"])
    if b is None:
        return
    try:
        s, _ = connect_to(b)
        q = declare_queue(s)[0]
        big = body_of(300000, 11)
        data = gen_publish(1, "", q, big)
        send_in_cuts(s, data, [100, 200, 5000, 70000])
        code, text = expect_close(s)[:2]
        eq(code, PRECONDITION_FAILED, "reply code")
        assert "larger than configured max size 100000" in text, text
        s.sendall(gen_channel_open(2))
        expect_method(s, *CHANNEL_OPEN_OK, channel=2)
        ok = body_of(99000, 12)
        s.sendall(gen_basic_publish(2, "", q) + gen_content_header(2, len(ok)))
        s.sendall(gen_body(2, ok)[:40])
        time.sleep(0.02)
        s.sendall(gen_body(2, ok)[40:])
        got = basic_get(s, 2, q, no_ack=True)
        assert got is not None and digest(got["body"]) == digest(ok), "the next message"
        s.close()
    finally:
        problems = b.stop()
    assert not problems, problems


@test(timeout=120)
def a_fanout_delivers_each_queue_an_intact_copy():
    """pika publishes 40 messages of 64 KiB .. 1 MiB + 3 to a fanout
    exchange bound to three queues; a pika consumer on each queue gets
    every body intact, in order."""
    import pika
    ex = uniq("fan")
    pub = pika_connect()
    ch = pub.channel()
    ch.exchange_declare(ex, "fanout", auto_delete=True)
    queues = []
    for i in range(3):
        q = ch.queue_declare(uniq("fanq"), exclusive=True).method.queue
        ch.queue_bind(q, ex)
        queues.append(q)
    ch.confirm_delivery()
    sizes = [64 * KiB, 64 * KiB + 1, 200000, MiB + 3, 17 * KiB]
    sums = []
    for n in range(40):
        body = body_of(sizes[n % len(sizes)], 500 + n)
        sums.append(digest(body))
        ch.basic_publish(ex, "", body, pika.BasicProperties(message_id=str(n)))
    for q in queues:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(sums) and time.monotonic() < deadline:
            m = ch.basic_get(q, auto_ack=True)
            if m[0] is None:
                time.sleep(0.02)
                continue
            got.append((m[1].message_id, digest(m[2])))
        eq([d for _, d in got], sums, "bodies from %s" % q)
        eq([i for i, _ in got], [str(n) for n in range(len(sums))], "order in %s" % q)
    pub.close()


@test(timeout=180)
def replicated_bodies_survive_their_primary():
    """Cluster mode only: 12 large messages published through a broker
    that is not the queue's primary (forwarded to it, replicated to its
    backup); the primary is killed and the promoted backup delivers every
    body intact."""
    if not quaytest.CLUSTERED or is_rabbitmq():
        print("# skip: cluster mode only")
        return
    import pika
    b = broker()
    con = pika_connect()
    ch = con.channel()
    q = ch.queue_declare(uniq("repl"), arguments={"x-quay-backups": 1}).method.queue
    ch.confirm_delivery()
    sums = []
    for n in range(12):
        body = body_of([64 * KiB, 300000, 2 * MiB + 7][n % 3], 900 + n)
        sums.append(digest(body))
        ch.basic_publish("", q, body)
    con.close()
    primary = b.primary_of(q)
    assert primary is not None and primary.name != quaytest.CLUSTER_CLIENT, primary
    wait_until(lambda: (quaytest._queue_info(primary, q, "/") or {}).get("in_sync"), 10,
               what="the backup in sync")
    backups = (quaytest._queue_info(primary, q, "/") or {}).get("in_sync")
    t0 = primary.kill()
    try:
        wait_until(lambda: b.primary_of(q) not in (None, primary), 15,
                   what="the backup promoted")
        print("# %s killed; %s (backups %s) promoted after %.2f s"
              % (primary.name, b.primary_of(q).name, backups, time.monotonic() - t0))
        con = pika_connect()
        ch = con.channel()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < len(sums) and time.monotonic() < deadline:
            m = ch.basic_get(q, auto_ack=True)
            if m[0] is None:
                time.sleep(0.05)
                continue
            got.append(digest(m[2]))
        eq(got, sums, "bodies from the promoted backup")
        ch.queue_delete(q)
        con.close()
    finally:
        primary.start()
        wait_until(lambda: all(m.view() and m.view().brokers.get(primary.name) == "up"
                               for m in b.members if m.alive()), 30,
                   what="the old primary back")


if __name__ == "__main__":
    run()
