"""Goal: read batching (net/read_batch.h) saves reads without holding
anyone's bytes.

A publisher that streams faster than the broker reads gets a receive
low-water mark, so its socket is read in batches; the mark must never keep
a peer waiting: the end of a stream, a synchronous request right after one
(tx.commit, a passive queue.declare) and whatever follows a pause are read
at once or after the wait (500 us), never held until more bytes come. A
publisher that waits for our answers (confirms) is never batched, and
--read-batch-us 0 turns batching off, and a stream of few frames a second
(large messages at a moderate rate) is not batched.

A client that never waits is read at most its share (--read-share, 128
KiB) a loop turn while others are read too, the rest in the turns after
(net/conn.c, "the turn's share"): every byte of it is still read, in
order, large bodies included.

Method: each test starts its own quayd with --http (quaytest.Broker) and
publishes over a raw socket (one sendall of the whole stream, so the
broker is the slower side and batching starts); the broker's counters come
from GET /api/overview ("network"). The assertions are about bytes
answered, never about speed: the figures live in bench/RESULTS.md.
"""
import contextlib
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F403

STREAM = 20000          # 1 KiB messages in a stream: ~21 MB, far beyond any socket buffer
BODY = b"x" * 1024


def start(extra=()):
    b = Broker(list(extra), external_ok=False, http=True)
    wait_until(lambda: _network(b) is not None, what="the HTTP API")
    return b


def _network(b):
    try:
        return b.api_get("/api/overview", timeout=5)["network"]
    except OSError:
        return None


def session(b, timeout=30):
    # No heartbeats (raw_sessions' handshake offers 0): nothing but our
    # answers is output to the publisher.
    s, = raw_sessions(b.host, b.port, 1, "guest", "guest")
    s.settimeout(timeout)  # a 21 MB sendall to an ASan broker
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def stream(queue, n=STREAM):
    one = gen_publish(1, "", queue, BODY)
    return one * n


def passive_count(s, queue, timeout=10):
    s.sendall(gen_queue_declare(1, queue, passive=True))
    m = expect_method(s, *QUEUE_DECLARE_OK, channel=1, timeout=timeout)
    m.args.shortstr()
    return m.args.long()


@contextlib.contextmanager
def publisher(prefix, extra=()):
    """A private quayd with the API on, a raw session to it and a queue."""
    b = start(extra)
    try:
        s = session(b)
        q = uniq(prefix)
        declare_queue(s, 1, q, exclusive=False)
        yield b, s, q
        s.close()
    finally:
        problems = b.stop()
        assert not problems, problems


@test
def a_stream_is_batched_and_the_request_after_it_is_answered():
    with publisher("rb") as (b, s, q):
        # The stream and a synchronous request in one write: the request is
        # the last bytes, below any mark, and must be read all the same.
        s.sendall(stream(q) + gen_queue_declare(1, q, passive=True))
        m = expect_method(s, *QUEUE_DECLARE_OK, channel=1, timeout=30)
        m.args.shortstr()
        eq(m.args.long(), STREAM, "messages in the queue when the request was answered")
        net = _network(b)
        assert net["read_batch_us"] == 500, net
        assert net["read_batches_started"] >= 1, net

        # A stream, a pause, then one small request on its own: whatever mark
        # the stream left is dropped by the timer, not by more bytes.
        before = _network(b)
        s.sendall(stream(q))
        time.sleep(0.3)
        eq(passive_count(s, q), 2 * STREAM, "messages after the second stream")
        after = _network(b)
        assert after["read_batches_started"] > before["read_batches_started"], (before, after)
        if MODE != "cluster":
            # Through a proxy the stream also meets flow control (4 MiB in
            # flight to the primary): a pause of reading drops the mark as
            # well, so only the answer above is certain there.
            assert after["read_batches_timed_out"] > before["read_batches_timed_out"], \
                (before, after)


@test
def a_transaction_commits_right_after_its_stream():
    with publisher("rb-tx") as (b, s, q):
        s.sendall(gen_tx_select(1))
        expect_method(s, *TX_SELECT_OK, channel=1)
        for round_ in range(1, 4):
            s.sendall(stream(q, 5000) + gen_tx_commit(1))
            expect_method(s, *TX_COMMIT_OK, channel=1, timeout=30)
            eq(passive_count(s, q), 5000 * round_, "committed messages after round %d" % round_)


@test
def a_publisher_well_below_the_dense_rate_is_not_batched():
    # 64 KiB every 2 ms: 32 MB/s, enough bytes for a mark, but 1,500 frames
    # a second, whose reads cost little: a mark would only delay them.
    with publisher("rb-sparse") as (b, s, q):
        before = _network(b)
        one = gen_publish(1, "", q, b"y" * 65536)
        for _ in range(300):
            s.sendall(one)
            time.sleep(0.002)
        eq(passive_count(s, q), 300, "messages after the paced stream")
        after = _network(b)
        eq(after["read_batches_started"], before["read_batches_started"],
           "marks raised on a sparse stream")


@test
def a_confirming_publisher_is_never_batched():
    with publisher("rb-confirm") as (b, s, q):
        s.sendall(gen_confirm_select(1))
        expect_method(s, *CONFIRM_SELECT_OK, channel=1)
        before = _network(b)
        # The confirms wait in the socket buffers (20000 acks of 21 bytes at
        # most) until the whole stream is sent.
        s.sendall(stream(q) + gen_queue_declare(1, q, passive=True))
        acked, count = 0, None
        while count is None or acked < STREAM:
            m = read_method(s, timeout=30)
            if m.id == QUEUE_DECLARE_OK:
                m.args.shortstr()
                count = m.args.long()
                continue
            eq(m.id, BASIC_ACK, "what a confirming publisher gets")
            tag, multiple = m.args.longlong(), m.args.bit()
            assert tag > acked and (multiple or tag == acked + 1), (acked, tag, multiple)
            acked = tag
        eq(count, STREAM, "messages after the confirmed stream")
        after = _network(b)
        eq(after["read_batches_started"], before["read_batches_started"],
           "marks raised on a connection we answer")


@test
def read_batch_us_0_turns_it_off():
    with publisher("rb-off", ["--read-batch-us", "0"]) as (b, s, q):
        s.sendall(stream(q) + gen_queue_declare(1, q, passive=True))
        m = expect_method(s, *QUEUE_DECLARE_OK, channel=1, timeout=30)
        m.args.shortstr()
        eq(m.args.long(), STREAM, "messages in the queue")
        net = _network(b)
        eq(net["read_batch_us"], 0, "wait reported")
        eq(net["read_batches_started"], 0, "marks raised with batching off")


def share_stream(queue):
    """3,000 messages: 1 KiB bodies numbered, every 100th a 1 MiB body that
    a sink reads across turns. Returns (bytes to send, bodies)."""
    bodies = [bytes([i % 251]) * (1 << 20) if i % 100 == 50 else b"%06d" % i * 170
              for i in range(3000)]
    return b"".join(gen_publish(1, "", queue, body) for body in bodies), bodies


def read_back(s, queue, bodies):
    s.sendall(gen_basic_consume(1, queue, tag="back", no_ack=True))
    expect_method(s, *BASIC_CONSUME_OK, channel=1)
    for i, body in enumerate(bodies):
        d = read_delivery(s, timeout=30)
        if d["body"] != body:
            raise AssertionError("message %d: %d bytes, %r... (expected %d bytes, %r...)"
                                 % (i, len(d["body"]), d["body"][:12], len(body), body[:12]))


@test
def clients_that_never_wait_are_read_a_share_a_turn():
    # Two streams at once: each is read at most 128 KiB a turn while the
    # other is read too (alone, one may have the loop).
    b = start()
    try:
        before = _network(b)
        eq(before["read_share"], 128 << 10, "the default share")
        sessions = [session(b), session(b)]
        queues = [uniq("rb-share") for _ in sessions]
        streams = []
        for s, q in zip(sessions, queues):
            declare_queue(s, 1, q, exclusive=False)
            streams.append(share_stream(q))
        senders = [threading.Thread(target=s.sendall, args=(data,))
                   for s, (data, _) in zip(sessions, streams)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        for s, q, (_, bodies) in zip(sessions, queues, streams):
            eq(passive_count(s, q, timeout=30), len(bodies), "messages in " + q)
        after = _network(b)
        assert after["reads_deferred"] > before["reads_deferred"], (before, after)
        for s, q, (_, bodies) in zip(sessions, queues, streams):
            read_back(s, q, bodies)
            s.close()
    finally:
        problems = b.stop()
        assert not problems, problems


@test
def read_share_0_reads_all_there_is():
    with publisher("rb-share-off", ["--read-share", "0"]) as (b, s, q):
        data, bodies = share_stream(q)
        s.sendall(data + gen_queue_declare(1, q, passive=True))
        m = expect_method(s, *QUEUE_DECLARE_OK, channel=1, timeout=30)
        m.args.shortstr()
        eq(m.args.long(), len(bodies), "messages in the queue")
        net = _network(b)
        eq(net["read_share"], 0, "share reported")
        eq(net["reads_deferred"], 0, "reads deferred without a share")
        read_back(s, q, bodies)


if __name__ == "__main__":
    run()
