"""Goal: what is durable survives a restart, and only that.

Method: quayd on a data directory of its own (in cluster mode, all three
brokers of a cluster together) is stopped (SIGTERM, and kill -9) and
started again on it, with pika clients before and after.
Checks: durable exchanges, durable queues with their arguments and the
bindings between durable things come back, transient ones do not;
persistent messages on durable queues come back in order, those handed
out but not acked with redelivered=true; a transaction's messages are in
the journal by commit-ok (a kill -9 right after it loses nothing). A kill
leaves the page cache, so this cannot tell written from fsynced: that
commit-ok and confirms wait for the fsync is what the journal's fault-disk
crash test (tests/unit/test_journal_crash.c) and the ticket plumbing check.
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import Restartable, eq, run, test  # noqa: E402

import pika  # noqa: E402

class Server(Restartable):
    """quaytest.Restartable (one quayd, or in cluster mode a whole cluster
    stopped and started together) with a pika channel on it."""

    def channel(self):
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, connection_attempts=3, retry_delay=1,
            blocked_connection_timeout=30))
        return c, c.channel()


def declare_world(ch):
    ch.exchange_declare("dx", "topic", durable=True)
    ch.exchange_declare("tx-transient", "fanout", durable=False)
    ch.queue_declare("dq", durable=True, arguments={"x-max-priority": 5, "x-message-ttl": 600000})
    ch.queue_declare("tq", durable=False)
    ch.queue_bind("dq", "dx", "a.#")
    ch.queue_bind("tq", "dx", "b.#")


def check_world(ch):
    ch.exchange_declare("dx", passive=True)
    ch.queue_declare("dq", durable=True, arguments={"x-max-priority": 5,
                                                    "x-message-ttl": 600000})
    for kind, name in (("exchange", "tx-transient"), ("queue", "tq")):
        try:
            if kind == "exchange":
                ch.exchange_declare(name, passive=True)
            else:
                ch.queue_declare(name, passive=True)
            raise AssertionError("transient %s %s survived a restart" % (kind, name))
        except pika.exceptions.ChannelClosedByBroker as e:
            eq(e.reply_code, 404)
            return False
    return True


@test(timeout=120)
def definitions_and_messages_survive_sigterm_and_kill9():
    server = Server()
    server.start()
    c, ch = server.channel()
    declare_world(ch)
    ch.confirm_delivery()
    for i in range(100):
        ch.basic_publish("dx", "a.x", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("dx", "a.x", b"transient-body", pika.BasicProperties(delivery_mode=1))
    for _ in range(3):
        ch.basic_get("dq", auto_ack=False)        # handed out, never acked
    ch.basic_get("dq", auto_ack=True)             # m3: acked
    c.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        server.stop(sig)
        server.start()
        c, ch = server.channel()
        check_world(ch)
        c.close()
    c, ch = server.channel()
    eq(ch.queue_declare("dq", passive=True).method.message_count, 99 - 3 + 3,
       "100 persistent - 1 acked; the transient message is gone")
    got = []
    while True:
        m, props, body = ch.basic_get("dq", auto_ack=True)
        if m is None:
            break
        got.append((body, m.redelivered))
    eq([b for b, _ in got], [b"m%d" % i for i in range(100) if i != 3], "order")
    eq([r for _, r in got[:3]], [True, True, True], "handed out before the crash")
    eq(any(r for _, r in got[3:]), False, "never handed out")
    # the binding came back too: a publish to dx reaches dq
    ch.basic_publish("dx", "a.y", b"after", pika.BasicProperties(delivery_mode=2))
    eq(ch.basic_get("dq", auto_ack=True)[2], b"after")
    c.close()
    server.stop()
    assert not server.close()


@test(timeout=120)
def a_purge_stays_purged_after_kill9():
    # The log is told of a purge as runs of ready seqs; what was handed out
    # and not acked survives it, and a priority queue's levels interleave.
    server = Server()
    server.start()
    c, ch = server.channel()
    ch.confirm_delivery()
    for name, args in (("pq", {}), ("pq-prio", {"x-max-priority": 3})):
        ch.queue_declare(name, durable=True, arguments=args)
        for i in range(2000):
            ch.basic_publish("", name, b"%d" % i, pika.BasicProperties(
                delivery_mode=1 if i % 4 == 0 else 2, priority=i % 3))
    c2, ch2 = server.channel()
    kept = {}
    for name in ("pq", "pq-prio"):
        held = [ch2.basic_get(name, auto_ack=False) for _ in range(4)]
        ch2.basic_nack(held[1][0].delivery_tag, requeue=True)  # ready again
        kept[name] = sorted(int(h[2]) for k, h in enumerate(held)
                            if k != 1 and h[1].delivery_mode == 2)
        eq(ch.queue_purge(name).method.message_count, 2000 - 3)
        # Confirmed once on disk, after the purge's records in the same log.
        ch.basic_publish("", name, b"after", pika.BasicProperties(delivery_mode=2))
    server.stop(signal.SIGKILL)
    server.start()
    c, ch = server.channel()
    for name in ("pq", "pq-prio"):
        got = []
        while True:
            m, _, body = ch.basic_get(name, auto_ack=True)
            if m is None:
                break
            got.append(body)
        eq(sorted(int(b) for b in got if b != b"after"), kept[name],
           "the persistent unacked ones, of %s" % name)
        eq(got.count(b"after"), 1, name)
    c.close()
    server.stop()
    assert not server.close()


@test(timeout=120)
def tx_commit_ok_means_on_disk():
    server = Server()
    server.start()
    c, ch = server.channel()
    ch.queue_declare("txq", durable=True)
    ch.tx_select()
    for i in range(500):
        ch.basic_publish("", "txq", b"t%d" % i, pika.BasicProperties(delivery_mode=2))
    ch.tx_commit()                                # returns after commit-ok
    server.stop(signal.SIGKILL)                   # at once
    server.start()
    c, ch = server.channel()
    eq(ch.queue_declare("txq", durable=True).method.message_count, 500)
    c.close()
    server.stop()
    assert not server.close()


if __name__ == "__main__":
    run()
