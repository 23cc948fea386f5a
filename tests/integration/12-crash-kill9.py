"""Goal: "confirmed" means "there after a crash". A publisher with confirms
talks to quayd, which is killed with SIGKILL at a random moment, restarted
on the same data directory, drained, and killed again, round after round.

Method: each message carries a unique id. The publisher pipelines
persistent publishes (up to WINDOW unconfirmed) and records every id the
broker confirmed. After each restart a checker consumes and acks whatever
the durable queue holds. Across all rounds it checks that:
  - every confirmed id is eventually delivered (zero loss),
  - no id is delivered after its ack was acknowledged by a clean drain
    (acked messages do not come back),
  - every delivered id was published (nothing invented), and ids
    published but unconfirmed before a kill may or may not appear (the
    at-least-once window), each at most once.
Messages that were delivered before a crash and come back are marked
redelivered. In cluster mode all three brokers are killed and restarted
together (the queue's primary and backup recover from their journals).
Usage: 12-crash-kill9.py [ROUNDS] (default 20, 8 in cluster mode; the soak
script tests/crash/soak.sh runs many more).
"""
import os
import random
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import (CHANNEL_OPEN_OK, QUEUE_DECLARE_OK, CONFIRM_SELECT_OK, BASIC_ACK,  # noqa
                      BASIC_NACK, CLUSTERED, Restartable, gen_channel_open, gen_queue_declare,
                      gen_confirm_select, gen_publish, gen_basic_consume, gen_basic_ack,
                      gen_basic_qos, expect_method, handshake, read_method, read_delivery,
                      ProtocolError)

QUAYD = os.environ.get("QUAYD")
QUEUE = "crash-test"
WINDOW = 500


class Server(Restartable):
    """quaytest.Restartable: one quayd, or in cluster mode the whole cluster
    killed and started together (the client on a broker that is not the
    queue's primary, the queue with a backup)."""

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake(s)
        s.sendall(gen_channel_open(1))
        expect_method(s, *CHANNEL_OPEN_OK, channel=1)
        s.sendall(gen_queue_declare(1, QUEUE, durable=True, exclusive=False))
        expect_method(s, *QUEUE_DECLARE_OK, channel=1)
        return s


class Frames:
    """Incremental frame reader over a non-blocking socket."""

    def __init__(self, sock):
        self.sock, self.buf, self.eof = sock, b"", False

    def pump(self, timeout):
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return []
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, OSError):
            data = b""
        if not data:
            self.eof = True
            return []
        self.buf += data
        out = []
        while len(self.buf) >= 7:
            ftype, channel, size = struct.unpack(">BHI", self.buf[:7])
            if len(self.buf) < size + 8:
                break
            out.append((ftype, channel, self.buf[7:7 + size]))
            self.buf = self.buf[size + 8:]
        return out


def publish_until_killed(server, next_id, confirmed, published):
    """Publishes with confirms; a timer kills quayd at a random moment."""
    s = server.connect()
    s.sendall(gen_confirm_select(1))
    expect_method(s, *CONFIRM_SELECT_OK, channel=1)
    s.setblocking(False)
    frames = Frames(s)
    seq_to_id = {}
    seq = 0
    kill_at = time.time() + random.uniform(0.05, 0.6)
    killed = False
    while not frames.eof:
        if not killed and time.time() >= kill_at:
            server.kill()
            killed = True
        if not killed and len(seq_to_id) < WINDOW:
            batch = b""
            for _ in range(min(50, WINDOW - len(seq_to_id))):
                seq += 1
                seq_to_id[seq] = next_id
                published.add(next_id)
                batch += gen_publish(1, "", QUEUE, b"id:%d" % next_id,
                                     props={"delivery_mode": 2, "message_id": str(next_id)})
                next_id += 1
            try:
                s.sendall(batch)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                pass
        for ftype, channel, payload in frames.pump(0.01 if not killed else 0.5):
            if ftype != 1:
                continue
            cls, mth = struct.unpack(">HH", payload[:4])
            if (cls, mth) == BASIC_ACK:
                tag, multiple = struct.unpack(">QB", payload[4:13])
                done = [k for k in seq_to_id if k <= tag] if multiple & 1 else [tag]
                for k in done:
                    confirmed.add(seq_to_id.pop(k))
            elif (cls, mth) == BASIC_NACK:
                raise AssertionError("broker nacked a publish (the disk is fine)")
        if killed and time.time() > kill_at + 2:
            break
    s.close()
    return next_id


def drain(server, delivered, acked_before, published, confirmed_before):
    """Consumes and acks everything in the queue; checks each delivery."""
    s = server.connect()
    s.sendall(gen_basic_qos(1, 1000))
    read_method(s)
    s.sendall(gen_basic_consume(1, QUEUE, tag="checker"))
    read_method(s)
    got = 0
    while True:
        try:
            d = read_delivery(s, timeout=1.0)
        except (ProtocolError, socket.timeout, OSError):
            break
        i = int(d["props"]["message_id"])
        assert d["body"] == b"id:%d" % i, d["body"]
        assert i in published, "delivered an id never published: %d" % i
        assert i not in acked_before, "acked id %d came back after a crash" % i
        assert i not in delivered, "id %d delivered twice" % i
        delivered.add(i)
        s.sendall(gen_basic_ack(1, d["delivery_tag"]))
        got += 1
    # Everything confirmed before this drain must be out by now.
    missing = confirmed_before - delivered
    assert not missing, "%d confirmed messages lost, e.g. %s" % (len(missing),
                                                                 sorted(missing)[:10])
    s.close()
    return got


def main():
    # A cluster takes longer to come back (an election, the map): fewer rounds.
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else (8 if CLUSTERED else 20)
    if not QUAYD:
        print("FAIL setup: set QUAYD")
        print("0 passed, 1 failed")
        sys.exit(1)
    random.seed(os.environ.get("SEED", time.time()))
    server = Server()
    published, confirmed, delivered = set(), set(), set()
    next_id = 1
    started = time.time()
    try:
        for r in range(rounds):
            server.start()
            acked_before = set(delivered)
            drain(server, delivered, acked_before, published, set(confirmed))
            next_id = publish_until_killed(server, next_id, confirmed, published)
        server.start()
        drain(server, delivered, set(delivered), published, set(confirmed))
        server.stop()
    except AssertionError as e:
        print("FAIL crash_rounds: %s (data and log in %s)" % (e, server.logs_dir()))
        print("0 passed, 1 failed")
        if server.cluster:
            server.cluster.failed = True
            server.close()
        sys.exit(1)
    problems = server.close()
    if problems:
        print("FAIL crash_rounds: %s" % problems)
        print("0 passed, 1 failed")
        sys.exit(1)
    unconfirmed_seen = len(delivered - confirmed)
    print("ok crash_rounds: %d rounds in %.1fs, %d published, %d confirmed, %d delivered, "
          "0 lost, %d unconfirmed delivered (allowed)"
          % (rounds, time.time() - started, len(published), len(confirmed), len(delivered),
             unconfirmed_seen))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
