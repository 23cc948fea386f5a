"""Goal: a durable queue can hold far more than the memory high-water mark.

Persistent messages on durable queues are in the journal, so their bodies
may leave memory: always for x-queue-mode=lazy, and past half the mark for
any durable queue (RabbitMQ's paging ratio). Method: quayd with
--memory-high-watermark 48MiB; a pipelined confirming publisher sends
160 MiB of persistent 4 KiB messages into one queue; the publisher must
finish (paging keeps memory under the mark, so the alarm does not stall it
for good), the broker's peak RSS must stay bounded, and a consumer must
then read every message back, intact and in order.
"""
import os
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F403

MiB = 1024 * 1024
MARK = 48 * MiB
SIZE = 4096
COUNT = 40960  # 160 MiB
# As in 10-limits.py: the product's bound is 1.2x the mark (bench/ checks
# the release build); a sanitized quayd carries redzones and quarantine.
RSS_BOUND = 2.0 if os.environ.get("QUAY_SANITIZED") in ("1", "ON", "true") else 1.2
# AddressSanitizer keeps 256 MB of freed memory in quarantine by default,
# which would hide what the broker itself holds.
os.environ["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                              ":quarantine_size_mb=16").lstrip(":")


def proc_status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def connect(b):
    s = socket.create_connection((b.host, b.port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    handshake(s)
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)
    return s


def publish_all(s, queue, count):
    """Pipelined persistent publishes with confirms (window 1000)."""
    s.sendall(gen_confirm_select(1))
    expect_method(s, *CONFIRM_SELECT_OK, channel=1)
    sent = acked = 0
    buf = b""
    deadline = time.time() + 240
    while acked < count:
        assert time.time() < deadline, "publisher stalled at %d/%d confirmed" % (acked, count)
        if sent < count and sent - acked < 1000:
            batch = []
            for _ in range(min(100, count - sent)):
                body = struct.pack(">I", sent) * (SIZE // 4)
                batch.append(gen_publish(1, "", queue, body,
                                         props={"delivery_mode": 2, "message_id": str(sent)}))
                sent += 1
            s.sendall(b"".join(batch))
        r, _, _ = select.select([s], [], [], 0.05)
        if not r:
            continue
        data = s.recv(1 << 20)
        assert data, "connection closed while publishing"
        buf += data
        while len(buf) >= 7:
            ftype, ch, size = struct.unpack(">BHI", buf[:7])
            if len(buf) < size + 8:
                break
            payload, buf = buf[7:7 + size], buf[size + 8:]
            if ftype != 1:
                continue
            cls, mth = struct.unpack(">HH", payload[:4])
            if (cls, mth) == BASIC_ACK:
                tag, multiple = struct.unpack(">QB", payload[4:13])
                acked = tag if multiple & 1 else max(acked, tag)
            elif (cls, mth) == BASIC_NACK:
                raise AssertionError("publish %d nacked" % struct.unpack(">Q", payload[4:12]))


def consume_all(s, queue, count):
    s.sendall(gen_basic_qos(1, 500))
    read_method(s)
    s.sendall(gen_basic_consume(1, queue, tag="reader"))
    read_method(s)
    for i in range(count):
        d = read_delivery(s, timeout=30)
        want = struct.pack(">I", i) * (SIZE // 4)
        assert d["body"] == want, "message %d: wrong body (message_id %s)" % (
            i, d["props"].get("message_id"))
        s.sendall(gen_basic_ack(1, d["delivery_tag"]))


def run_case(arguments):
    b = Broker(["--memory-high-watermark", "48MiB"], external_ok=False)
    try:
        baseline = proc_status(b.proc.pid, "VmRSS")
        s = connect(b)
        q = uniq("paged")
        s.sendall(gen_queue_declare(1, q, durable=True, exclusive=False, arguments=arguments))
        expect_method(s, *QUEUE_DECLARE_OK, channel=1)
        publish_all(s, q, COUNT)
        # What the broker grew by, over its own start-up size (a sanitized
        # build starts large), is held to the bound.
        grown = proc_status(b.proc.pid, "VmHWM") - baseline
        assert grown < RSS_BOUND * MARK, "RSS grew %.1f MiB with %d MiB queued, mark %d MiB" % (
            grown / MiB, COUNT * SIZE // MiB, MARK // MiB)
        s.sendall(gen_queue_declare(1, q, passive=True))
        m = expect_method(s, *QUEUE_DECLARE_OK, channel=1)
        m.args.shortstr()
        eq(m.args.long(), COUNT, "messages in the queue")
        consume_all(s, q, COUNT)
        s.close()
    finally:
        problems = b.stop()
        assert not problems, problems


@test(timeout=280)
def lazy_queue_keeps_its_backlog_on_disk():
    run_case({"x-queue-mode": "lazy"})


@test(timeout=280)
def durable_queue_pages_out_past_half_the_mark():
    run_case(None)


if __name__ == "__main__":
    run()
