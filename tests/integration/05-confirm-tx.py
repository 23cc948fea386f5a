"""05-confirm-tx: publisher confirms, transactions and channel.flow.

Goal: confirm mode (ack tags, multiple-ack coverage, return-before-ack,
nack on reject-publish overflow), tx mode (commit/rollback of publishes and
acks, returns at commit), the mode-switch errors, and channel.flow all
behave like RabbitMQ 3.10.

Method: raw frames where the exact frame sequence matters (ack tags and the
`multiple` flag, return/ack order, commit-ok order), pika for the rest.
RabbitMQ coalesces confirms freely (multiple=true), so the tests check what
the acks *cover*, never how they are batched.  Observed on RabbitMQ 3.10.8
(see RABBITMQ-NOTES.md).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403
import pika.exceptions as pe  # noqa: E402


def confirm_channel():
    s = raw_connection()
    s.sendall(gen_confirm_select(1))
    expect_method(s, *CONFIRM_SELECT_OK, channel=1)
    return s


class Confirms:
    """Tracks which publish sequence numbers have been acked / nacked.
    Each is answered once. Answers may come out of order (a publish that
    waits for nothing is not held behind one that waits for a backup, as
    in RabbitMQ), but a multiple ack only ever spans publishes still
    outstanding: it never passes over one answered before (a client that
    took "multiple" as "everything up to here" would read a nack as an
    ack)."""

    def __init__(self):
        self.acked, self.nacked = set(), set()
        self.log = []

    def feed(self, m):
        tag, multiple = m.args.longlong(), m.args.bit()
        target = self.acked if m.id == BASIC_ACK else self.nacked
        self.log.append((m.id, tag, multiple))
        answered = self.acked | self.nacked
        if multiple:
            new = set(range(1, tag + 1)) - answered
            assert new, "multiple confirm for %d covers nothing new (log %r)" % (
                tag, self.log[-5:])
            passed = {t for t in answered if min(new) < t <= tag}
            assert not passed, "multiple confirm for %d passes over %r, answered before " \
                "(log %r)" % (tag, sorted(passed), self.log[-5:])
        else:
            assert tag not in answered, "tag %d confirmed twice (log %r)" % (tag, self.log[-5:])
            new = {tag}
        target.update(new)

    def done(self, n):
        return len(self.acked) + len(self.nacked) >= n


@test
def confirm_select_then_acks_cover_every_publish():
    s = confirm_channel()
    q = declare_queue(s)[0]
    n = 500
    s.sendall(b"".join(gen_publish(1, "", q, b"%d" % i) for i in range(n)))
    c = Confirms()
    while not c.done(n):
        m = read_method(s)
        assert m.id in (BASIC_ACK, BASIC_NACK), m
        c.feed(m)
    eq(c.acked, set(range(1, n + 1)), "acked tags")
    eq(c.nacked, set())
    assert_no_frame(s, 0.3)   # no extra or duplicate confirms
    eq(declare_queue(s, name=q, passive=True)[1], n, "messages in queue")


@test
def confirm_tags_continue_across_publishes_and_count_unroutable():
    s = confirm_channel()
    # unroutable (no mandatory) publishes are confirmed too and take a tag
    s.sendall(gen_publish(1, "", "nowhere", b"a"))
    m = expect_method(s, *BASIC_ACK)
    eq((m.args.longlong(), m.args.bit()), (1, False))
    q = declare_queue(s)[0]
    s.sendall(gen_publish(1, "", q, b"b"))
    m = expect_method(s, *BASIC_ACK)
    eq(m.args.longlong(), 2)


def burst_acks(s, n, queue, persistent=False, first_tag=1):
    """Publishes n messages (tags first_tag..) in one write on a confirm
    channel; returns the (tag, multiple) of every basic.ack until all are
    confirmed, checking that each is confirmed exactly once and none is
    nacked."""
    props = {"delivery_mode": 2} if persistent else None
    s.sendall(b"".join(gen_publish(1, "", queue, b"x" * 100, props) for _ in range(n)))
    frames, confirmed = [], first_tag - 1
    n += first_tag - 1
    while confirmed < n:
        m = read_method(s, timeout=10)
        if m.id == BASIC_NACK:
            raise AssertionError("nacked: %r" % m)
        if m.id != BASIC_ACK:
            continue
        tag, multiple = m.args.longlong(), m.args.bit()
        assert tag > confirmed and (multiple or tag == confirmed + 1), (
            "ack %d (multiple=%s) after %d" % (tag, multiple, confirmed))
        frames.append((tag, multiple))
        confirmed = tag
    eq(confirmed, n, "last tag")
    assert_no_frame(s, 0.2)
    return frames


@test
def confirms_of_a_burst_are_coalesced_into_multiple_acks():
    """640 publishes in one write are answered with a few multiple acks (as
    RabbitMQ does: amqplib's own test counts on it), through a proxy too,
    transient or waiting for the journal's fsync alike."""
    s = raw_connection()
    s.sendall(gen_confirm_select(1))
    expect_method(s, *CONFIRM_SELECT_OK)
    q = declare_queue(s, 1, uniq("burst"), exclusive=False)[0]
    dq = declare_queue(s, 1, uniq("burst-durable"), exclusive=False, durable=True)[0]
    n = 640
    for i, (queue, persistent) in enumerate(((q, False), (dq, True))):
        frames = burst_acks(s, n, queue, persistent, first_tag=1 + i * n)
        assert len(frames) <= n // 4, "%d ack frames for %d publishes" % (len(frames), n)
        assert any(multiple for _, multiple in frames), frames
    for queue in (q, dq):
        s.sendall(gen_queue_delete(1, queue))
        expect_method(s, *QUEUE_DELETE_OK)


@test
def confirm_select_is_idempotent_and_nowait_has_no_reply():
    s = confirm_channel()
    s.sendall(gen_confirm_select(1))
    expect_method(s, *CONFIRM_SELECT_OK)
    s.sendall(gen_confirm_select(1, nowait=True))
    assert_no_frame(s, 0.3)
    s.sendall(gen_channel_open(2) + gen_confirm_select(2, nowait=True))
    expect_method(s, *CHANNEL_OPEN_OK)
    assert_no_frame(s, 0.3)
    q = declare_queue(s, 2)[0]
    s.sendall(gen_publish(2, "", q, b"x"))
    m = expect_method(s, *BASIC_ACK, channel=2)
    eq(m.args.longlong(), 1)


@test
def mandatory_unroutable_return_arrives_before_its_ack():
    s = confirm_channel()
    q = declare_queue(s)[0]
    # seq 1 routable, 2 unroutable, 3 routable, 4 unroutable, 5 routable
    plan = [q, "nowhere-1", q, "nowhere-2", q]
    s.sendall(b"".join(gen_publish(1, "", rk, b"%d" % i, mandatory=True)
                       for i, rk in enumerate(plan)))
    c = Confirms()
    returned = []
    while not c.done(len(plan)):
        m = read_method(s)
        if m.id == BASIC_RETURN:
            code, text, ex, rk = (m.args.short(), m.args.shortstr(), m.args.shortstr(),
                                  m.args.shortstr())
            eq((code, text, ex), (NO_ROUTE, "NO_ROUTE", ""))
            props, body, _ = read_content(s)
            seq = int(body) + 1
            assert seq not in c.acked, "return for #%d after its ack (%r)" % (seq, c.log)
            returned.append((seq, rk))
        else:
            c.feed(m)
    eq(returned, [(2, "nowhere-1"), (4, "nowhere-2")])
    eq(c.acked, {1, 2, 3, 4, 5}, "returned messages are still acked (not nacked)")


@test
def pika_confirm_delivery_and_unroutable_error():
    ch = pika_connect().channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(100):
        ch.basic_publish("", q, b"%d" % i, mandatory=True)
    eq(ch.queue_declare(q, passive=True).method.message_count, 100)
    try:
        ch.basic_publish("", "nowhere", b"x", mandatory=True)
        raise AssertionError("expected UnroutableError")
    except pe.UnroutableError as e:
        eq(len(e.messages), 1)
        eq(e.messages[0].method.reply_code, NO_ROUTE)


@test
def reject_publish_overflow_is_nacked():
    s = confirm_channel()
    q = declare_queue(s, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})[0]
    s.sendall(b"".join(gen_publish(1, "", q, b"%d" % i) for i in range(4)))
    c = Confirms()
    while not c.done(4):
        c.feed(read_method(s))
    eq((c.acked, c.nacked), ({1, 2}, {3, 4}))
    eq(declare_queue(s, name=q, passive=True)[1], 2)


@test
def confirm_on_tx_channel_and_tx_on_confirm_channel_are_406():
    s = raw_connection()
    s.sendall(gen_tx_select(1))
    expect_method(s, *TX_SELECT_OK)
    s.sendall(gen_confirm_select(1))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
        85, 10))
    s = confirm_channel()
    s.sendall(gen_tx_select(1))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
        90, 10))


@test
def commit_or_rollback_without_select_is_406():
    for gen, ids in ((gen_tx_commit, (90, 20)), (gen_tx_rollback, (90, 30))):
        s = raw_connection()
        s.sendall(gen(1))
        eq(expect_close(s, connection=False),
           (PRECONDITION_FAILED, "PRECONDITION_FAILED - channel is not transactional") + ids)


@test
def tx_commit_and_rollback_of_publishes():
    s = raw_connection()
    q = declare_queue(s)[0]
    s.sendall(gen_tx_select(1))
    expect_method(s, *TX_SELECT_OK)
    s.sendall(gen_tx_select(1))              # idempotent
    expect_method(s, *TX_SELECT_OK)
    for i in range(3):
        s.sendall(gen_publish(1, "", q, b"rolled-back-%d" % i))
    s.sendall(gen_tx_rollback(1))
    expect_method(s, *TX_ROLLBACK_OK)
    eq(basic_get(s, 1, q), None, "rolled-back publishes never arrive")
    for i in range(2):
        s.sendall(gen_publish(1, "", q, b"committed-%d" % i))
    assert_no_frame(s, 0.2)
    eq(declare_queue(s, name=q, passive=True)[1], 0, "uncommitted publishes are not in the queue")
    s.sendall(gen_tx_commit(1))
    expect_method(s, *TX_COMMIT_OK)
    eq([basic_get(s, 1, q, no_ack=True)["body"] for _ in range(2)],
       [b"committed-0", b"committed-1"])
    # the channel stays transactional: another commit with nothing is fine
    s.sendall(gen_tx_commit(1))
    expect_method(s, *TX_COMMIT_OK)


@test
def tx_publish_refused_by_reject_publish_fails_the_commit():
    """A transaction whose publish a full x-overflow=reject-publish queue
    refuses: tx.commit is answered 406 "partial tx completion" (a channel
    error), and what the queue took stays (RabbitMQ 3.10.8). Through a
    proxy the refusal comes from the queue's primary: the same answer (it
    was a connection error, 541, there; commit-ok on one broker)."""
    s = raw_connection()
    q = declare_queue(s, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})[0]
    s.sendall(gen_tx_select(1))
    expect_method(s, *TX_SELECT_OK)
    for i in range(3):
        s.sendall(gen_publish(1, "", q, b"%d" % i))
    s.sendall(gen_tx_commit(1))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - partial tx completion", 90, 20))
    s.sendall(gen_channel_open(2))
    expect_method(s, *CHANNEL_OPEN_OK)
    eq(basic_get(s, 2, q, no_ack=True)["body"], b"0")
    eq(basic_get(s, 2, q), None)


@test
def tx_acks_take_effect_only_on_commit():
    s = raw_connection()
    q = declare_queue(s)[0]
    for i in range(2):
        s.sendall(gen_publish(1, "", q, b"m%d" % i))
    s.sendall(gen_tx_select(1))
    expect_method(s, *TX_SELECT_OK)
    t1 = basic_get(s, 1, q)["delivery_tag"]
    t2 = basic_get(s, 1, q)["delivery_tag"]
    s.sendall(gen_basic_ack(1, t1))
    s.sendall(gen_tx_rollback(1))
    expect_method(s, *TX_ROLLBACK_OK)
    # the rolled-back ack is forgotten; both messages are still unacked:
    # acking both now and committing removes them.
    s.sendall(gen_basic_ack(1, t2, multiple=True))
    s.sendall(gen_tx_commit(1))
    expect_method(s, *TX_COMMIT_OK)
    s.sendall(gen_channel_close(1))
    expect_method(s, *CHANNEL_CLOSE_OK)
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK)
    eq(declare_queue(s, name=q, passive=True)[1], 0, "both acked by the commit")


@test
def tx_rolled_back_ack_leaves_message_unacked():
    s = raw_connection()
    q = declare_queue(s)[0]
    s.sendall(gen_publish(1, "", q, b"keep"))
    s.sendall(gen_tx_select(1))
    expect_method(s, *TX_SELECT_OK)
    t = basic_get(s, 1, q)["delivery_tag"]
    s.sendall(gen_basic_ack(1, t) + gen_tx_rollback(1))
    expect_method(s, *TX_ROLLBACK_OK)
    s.sendall(gen_channel_close(1))          # unacked -> requeued
    expect_method(s, *CHANNEL_CLOSE_OK)
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK)
    d = basic_get(s, 1, q, no_ack=True)
    eq((d["body"], d["redelivered"]), (b"keep", True))


@test
def tx_mandatory_return_is_sent_at_commit_before_commit_ok():
    s = raw_connection()
    s.sendall(gen_tx_select(1))
    expect_method(s, *TX_SELECT_OK)
    s.sendall(gen_publish(1, "", "nowhere", b"bounce", mandatory=True))
    assert_no_frame(s, 0.3)                  # nothing before the commit
    s.sendall(gen_tx_commit(1))
    m = expect_method(s, *BASIC_RETURN)
    eq((m.args.short(), m.args.shortstr(), m.args.shortstr(), m.args.shortstr()),
       (NO_ROUTE, "NO_ROUTE", "", "nowhere"))
    eq(read_content(s)[1], b"bounce")
    expect_method(s, *TX_COMMIT_OK)


@test
def pika_tx():
    ch = pika_connect().channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"a")
    ch.tx_rollback()
    ch.basic_publish("", q, b"b")
    ch.tx_commit()
    m, p, body = ch.basic_get(q, auto_ack=True)
    eq(body, b"b")
    ch.tx_commit()
    eq(ch.basic_get(q), (None, None, None))


@test
def channel_flow():
    # RabbitMQ 3.10: flow(active=true) -> flow-ok(active=true);
    # flow(active=false) -> connection.close 540 "NOT_IMPLEMENTED - active=false".
    s = raw_connection()
    s.sendall(gen_channel_flow(1, True))
    m = expect_method(s, *CHANNEL_FLOW_OK, channel=1)
    eq(m.args.bit(), True)
    s.sendall(gen_channel_flow(1, False))
    eq(expect_close(s, connection=True),
       (NOT_IMPLEMENTED, "NOT_IMPLEMENTED - active=false", 20, 20))
    expect_closed_socket(s)
    # a flow-ok the server never asked for is "unimplemented"
    s = raw_connection()
    s.sendall(gen_method(1, 20, 21, bits(True)))
    eq(expect_close(s, connection=True),
       (COMMAND_INVALID, "COMMAND_INVALID - unimplemented method", 20, 21))


if __name__ == "__main__":
    run()
