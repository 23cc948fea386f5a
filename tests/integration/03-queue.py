"""03-queue: queue declare/bind/purge/delete semantics.

Goal: queue management behaves like RabbitMQ 3.10: server-generated names,
passive declares, exclusivity, equivalence checks, declare-ok counts, purge
and delete counts, if-unused / if-empty, auto-delete, reserved names,
binding errors, and the "empty name = last queue declared on this channel"
shortcut.

Method: pika BlockingConnection (plus one raw-frame check).  Expected codes
and texts observed on RabbitMQ 3.10.8; see RABBITMQ-NOTES.md.
"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403

LOCKED = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost "
          "'/'. It could be originally declared on another connection or the exclusive "
          "property value does not match that of the original declaration.")


def chan(confirm=True):
    ch = pika_connect().channel()
    if confirm:
        ch.confirm_delivery()
    return ch


def fill(ch, q, n):
    for i in range(n):
        ch.basic_publish("", q, b"m%d" % i)


@test
def server_named_queue():
    ch = chan()
    ok = ch.queue_declare("", exclusive=True).method
    assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_\-]{22}", ok.queue), ok.queue
    eq((ok.message_count, ok.consumer_count), (0, 0))
    ok2 = ch.queue_declare("", exclusive=True).method
    assert ok2.queue != ok.queue
    ch.queue_declare(ok.queue, passive=True)
    # Even an existing server-named queue cannot be re-declared actively:
    # the amq.* prefix check comes first.
    eq(expect_channel_error(ACCESS_REFUSED, ch.queue_declare, ok.queue, exclusive=True),
       "ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'" % ok.queue)


@test
def passive_declare_of_missing_is_404():
    ch = chan()
    name = uniq("missing")
    eq(expect_channel_error(NOT_FOUND, ch.queue_declare, name, passive=True),
       "NOT_FOUND - no queue '%s' in vhost '/'" % name)
    # passive with the empty name is a plain 404 too
    ch = chan()
    ch.queue_declare("", exclusive=True)
    eq(expect_channel_error(NOT_FOUND, ch.queue_declare, "", passive=True),
       "NOT_FOUND - no queue '' in vhost '/'")


@test
def passive_declare_ignores_other_flags():
    ch = chan()
    name = uniq("q")
    ch.queue_declare(name, exclusive=True)
    ok = ch.queue_declare(name, passive=True, durable=True, auto_delete=True).method
    eq(ok.queue, name)


@test
def exclusive_queue_from_another_connection_is_405():
    ch = chan()
    name = uniq("excl")
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, "amq.direct", "k")
    calls = [
        ("passive declare", lambda c: c.queue_declare(name, passive=True)),
        ("declare", lambda c: c.queue_declare(name, exclusive=True)),
        ("declare non-excl", lambda c: c.queue_declare(name)),
        ("consume", lambda c: c.basic_consume(name, lambda *a: None)),
        ("get", lambda c: c.basic_get(name)),
        ("purge", lambda c: c.queue_purge(name)),
        ("delete", lambda c: c.queue_delete(name)),
        ("bind", lambda c: c.queue_bind(name, "amq.fanout", "")),
    ]
    other = pika_connect()
    for what, call in calls:
        c = other.channel()
        eq(expect_channel_error(RESOURCE_LOCKED, call, c), LOCKED % name, what)
    c = other.channel()
    eq(expect_channel_error(RESOURCE_LOCKED, c.queue_unbind, name, "amq.direct", "k"),
       LOCKED % name, "unbind")
    # RabbitMQ quirk: unbinding a binding that does not exist succeeds even
    # on someone else's exclusive queue (the lock is checked only when the
    # binding is found).
    other.channel().queue_unbind(name, "amq.direct", "no-such-key")
    # the owner still has it
    ch.queue_declare(name, passive=True)


@test
def exclusive_queue_goes_away_with_its_connection():
    c = pika_connect()
    name = uniq("excl")
    c.channel().queue_declare(name, exclusive=True)
    c.close()
    wait_until(lambda: _missing(name), what="exclusive queue deleted")


def _missing(name):
    import pika.exceptions as pe
    try:
        pika_connect().channel().queue_declare(name, passive=True)
        return False
    except pe.ChannelClosedByBroker as e:
        return e.reply_code == NOT_FOUND


@test
def equivalence_mismatch_is_406():
    ch = chan()
    name = uniq("q")
    ch.queue_declare(name, auto_delete=False)
    try:
        eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_declare, name, durable=True),
           "PRECONDITION_FAILED - inequivalent arg 'durable' for queue '%s' in vhost '/': "
           "received 'true' but current is 'false'" % name)
        ch = chan()
        eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_declare, name, auto_delete=True),
           "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '%s' in vhost '/': "
           "received 'true' but current is 'false'" % name)
        # exclusive mismatch is 405, not 406
        ch = chan()
        eq(expect_channel_error(RESOURCE_LOCKED, ch.queue_declare, name, exclusive=True),
           LOCKED % name)
    finally:
        chan().queue_delete(name)


@test
def argument_mismatch_is_406():
    ch = chan()
    name = uniq("q")
    ch.queue_declare(name, exclusive=True, arguments={"x-message-ttl": 1000})
    eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_declare, name, exclusive=True,
                            arguments={"x-message-ttl": 2000}),
       "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in vhost '/': "
       "received '2000' but current is '1000'" % name)
    ch = pika_connect().channel()
    name = uniq("q")
    ch.queue_declare(name, exclusive=True, arguments={"x-message-ttl": 1000})
    eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_declare, name, exclusive=True),
       "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in vhost '/': "
       "received none but current is the value '1000' of type 'signedint'" % name)
    # unknown (non x-) arguments are not compared
    ch = pika_connect().channel()
    name = uniq("q")
    ch.queue_declare(name, exclusive=True, arguments={"foo": 1})
    ch.queue_declare(name, exclusive=True, arguments={"foo": 2})


@test
def declare_ok_counts():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    ok = ch.queue_declare(q, passive=True).method
    eq((ok.message_count, ok.consumer_count), (3, 0))
    ch2 = ch.connection.channel()      # exclusive queue: same connection
    # consumers with prefetch 1 take one message each into "unacked"
    ch2.basic_qos(prefetch_count=1)
    ch2.basic_consume(q, lambda *a: None)
    ch2.basic_consume(q, lambda *a: None)
    # message_count counts only ready messages (not the 2 unacked ones)
    wait_until(lambda: _counts(ch, q) == (1, 2), what="declare-ok counts (1, 2), last %r"
               % (_counts(ch, q),))


def _counts(ch, q):
    ok = ch.queue_declare(q, passive=True).method
    return ok.message_count, ok.consumer_count


@test
def purge_returns_count():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 5)
    m, _, _ = ch.basic_get(q, auto_ack=False)       # one unacked: not purged
    eq(ch.queue_purge(q).method.message_count, 4)
    eq(ch.queue_purge(q).method.message_count, 0)
    ch.basic_nack(m.delivery_tag, requeue=True)
    # (RabbitMQ applies the requeue asynchronously w.r.t. declare-ok counts)
    wait_until(lambda: _counts(ch, q)[0] == 1, what="requeued message counted")
    name = uniq("missing")
    eq(expect_channel_error(NOT_FOUND, ch.queue_purge, name),
       "NOT_FOUND - no queue '%s' in vhost '/'" % name)


@test
def delete_returns_message_count():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 7)
    eq(ch.queue_delete(q).method.message_count, 7)
    expect_channel_error(NOT_FOUND, ch.queue_declare, q, passive=True)
    # deleting a missing queue is fine in 3.10 (delete-ok with count 0)
    ch = chan()
    eq(ch.queue_delete(uniq("missing")).method.message_count, 0)


@test
def delete_if_unused_and_if_empty_are_406():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    tag = ch.basic_consume(q, lambda *a: None)
    eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_delete, q, if_unused=True),
       "PRECONDITION_FAILED - queue '%s' in vhost '/' in use" % q)
    ch = ch.connection.channel()
    ch.confirm_delivery()
    fill(ch, q, 1)
    eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_delete, q, if_empty=True),
       "PRECONDITION_FAILED - queue '%s' in vhost '/' not empty" % q)
    del tag
    # a fetched-but-unacked message does not make a queue "not empty"
    # (if-empty looks at ready messages only)
    ch = ch.connection.channel()
    ch.confirm_delivery()
    q2 = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q2, 1)
    m2, _, _ = ch.basic_get(q2, auto_ack=False)
    eq(ch.queue_delete(q2, if_empty=True, if_unused=True).method.message_count, 0)


@test
def auto_delete_queue_deleted_when_last_consumer_cancels():
    ch = chan()
    name = uniq("ad")
    ch.queue_declare(name, auto_delete=True)
    ch.queue_declare(name, passive=True)           # no consumer yet: stays
    t1 = ch.basic_consume(name, lambda *a: None)
    t2 = ch.basic_consume(name, lambda *a: None)
    ch.basic_cancel(t1)
    ch.queue_declare(name, passive=True)           # one consumer left
    ch.basic_cancel(t2)
    wait_until(lambda: _missing(name), what="auto-delete queue deleted")


@test
def auto_delete_queue_goes_before_the_next_method():
    """A cancel that deletes an auto-delete queue (and with it its
    auto-delete exchange) has done so before the client's next method: the
    same names declared again at once are new, and a delete of the queue
    succeeds with 0 (py-amqp's and amqplib's clients do this)."""
    ch = chan(confirm=False)
    x, q = uniq("adx"), uniq("adq")
    for i in range(10):
        ch.exchange_declare(x, "direct", auto_delete=True)
        ch.queue_declare(q, auto_delete=True)
        ch.queue_bind(q, x, "k")
        ch.basic_publish(x, "k", b"m%d" % i)
        got = []
        tag = ch.basic_consume(q, lambda c, m, p, body: got.append(body), auto_ack=True)
        deadline = time.time() + 5
        while not got and time.time() < deadline:
            ch.connection.process_data_events(time_limit=0.05)
        eq(got, [b"m%d" % i], "round %d" % i)
        ch.basic_cancel(tag)        # the last consumer: queue and exchange go
    eq(ch.queue_delete(q).method.message_count, 0, "deleting what went is fine")
    eq(_missing(q), True, "gone")
    # The same, pipelined, when the consumer's channel closes (or it
    # cancels): the declares right behind the close find nothing stale.
    s = raw_connection()
    s.sendall(gen_channel_open(2))
    expect_method(s, *CHANNEL_OPEN_OK, channel=2)
    for i in range(6):
        s.sendall(gen_exchange_declare(2, x, auto_delete=True) +
                  gen_queue_declare(2, q, auto_delete=True) + gen_queue_bind(2, q, x, "k") +
                  gen_basic_consume(2, q, "c", no_ack=True))
        for reply in (EXCHANGE_DECLARE_OK, QUEUE_DECLARE_OK, QUEUE_BIND_OK, BASIC_CONSUME_OK):
            expect_method(s, *reply, channel=2)
        end = (gen_channel_close(2) if i % 2 == 0
               else gen_method(2, 60, 30, shortstr("c") + bits(False)))  # basic.cancel
        again = (gen_exchange_declare(1, x, auto_delete=True) +
                 gen_queue_declare(1, q, auto_delete=True) + gen_queue_bind(1, q, x, "k") +
                 gen_queue_delete(1, q))
        if is_rabbitmq():
            # RabbitMQ deletes an auto-delete queue after it answered the
            # cancel (its queue process stops): pipelined declares race it
            # (observed with 3.10.8). quay's deletion is done before its next
            # method, on one broker and through a proxy alike.
            s.sendall(end)
            time.sleep(0.3)
            s.sendall(again)
        else:
            s.sendall(end + again)
        # In order on each channel (RabbitMQ may interleave the two).
        want = {2: [CHANNEL_CLOSE_OK if i % 2 == 0 else (60, 31)],
                1: [EXCHANGE_DECLARE_OK, QUEUE_DECLARE_OK, QUEUE_BIND_OK, QUEUE_DELETE_OK]}
        while want[1] or want[2]:
            m = read_method(s)
            assert want.get(m.channel) and m.id == want[m.channel][0], (i, m)
            want[m.channel].pop(0)
        if i % 2 == 0:
            s.sendall(gen_channel_open(2))
            expect_method(s, *CHANNEL_OPEN_OK, channel=2)
    eq(_missing(q), True, "gone")


@test
def auto_delete_queues_of_one_channel_all_go_before_its_close_ok():
    """A channel.close that removes the last consumers of several
    auto-delete queues (each bound to its own auto-delete exchange) answers
    close-ok once all of them are gone: declares pipelined behind it make
    new ones (of another kind, which the old ones would refuse)."""
    names = [(uniq("amx%d" % k), uniq("amq%d" % k)) for k in range(3)]
    s = raw_connection()
    for i in range(4):
        s.sendall(gen_channel_open(2))
        expect_method(s, *CHANNEL_OPEN_OK, channel=2)
        setup = b""
        for k, (x, q) in enumerate(names):
            setup += (gen_exchange_declare(2, x, auto_delete=True) +
                      gen_queue_declare(2, q, auto_delete=True) + gen_queue_bind(2, q, x, "k") +
                      gen_basic_consume(2, q, "c%d" % k, no_ack=True))
        s.sendall(setup)
        # (RabbitMQ may answer a consume after the next declares.)
        got = sorted(read_method(s).id for _ in range(4 * len(names)))
        assert got == sorted([EXCHANGE_DECLARE_OK, QUEUE_DECLARE_OK, QUEUE_BIND_OK,
                              BASIC_CONSUME_OK] * len(names)), (i, got)
        again = b""
        for x, q in names:
            again += (gen_exchange_declare(1, x, "fanout") + gen_queue_declare(1, q) +
                      gen_queue_delete(1, q) + gen_method(1, 40, 20, short(0) + shortstr(x) +
                                                          bits(False, False)))
        if is_rabbitmq():
            s.sendall(gen_channel_close(2))
            time.sleep(0.3)  # RabbitMQ's queue processes stop after its close-ok
            s.sendall(again)
        else:
            s.sendall(gen_channel_close(2) + again)
        want = {2: [CHANNEL_CLOSE_OK],
                1: [EXCHANGE_DECLARE_OK, QUEUE_DECLARE_OK, QUEUE_DELETE_OK, (40, 21)] * 3}
        while want[1] or want[2]:
            m = read_method(s)
            assert want.get(m.channel) and m.id == want[m.channel][0], (i, m)
            want[m.channel].pop(0)
    s.close()


@test
def auto_delete_queue_goes_with_its_connection():
    """A connection that closes holding the last consumer of an auto-delete
    queue (bound to an auto-delete exchange) has deleted both by its
    close-ok: another connection declaring the names right after makes new
    ones (of another kind: inequivalent to the old ones, had they stayed)."""
    x, q = uniq("acx"), uniq("acq")
    other = raw_connection()
    for i in range(6):
        s = raw_connection(channel=2)
        s.sendall(gen_exchange_declare(2, x, auto_delete=True) +
                  gen_queue_declare(2, q, auto_delete=True) + gen_queue_bind(2, q, x, "k") +
                  gen_basic_consume(2, q, "c", no_ack=True))
        for reply in (EXCHANGE_DECLARE_OK, QUEUE_DECLARE_OK, QUEUE_BIND_OK, BASIC_CONSUME_OK):
            expect_method(s, *reply, channel=2)
        s.sendall(gen_connection_close())
        expect_method(s, *CONNECTION_CLOSE_OK, channel=0)
        s.close()
        if is_rabbitmq():
            time.sleep(0.3)  # its queue process stops after the close (3.10.8 races here)
        other.sendall(gen_exchange_declare(1, x, "fanout") + gen_queue_declare(1, q) +
                      gen_queue_delete(1, q) + gen_method(1, 40, 20, short(0) + shortstr(x) +
                                                         bits(False, False)))
        for reply in (EXCHANGE_DECLARE_OK, QUEUE_DECLARE_OK, QUEUE_DELETE_OK,
                      (40, 21)):  # exchange.delete-ok
            m = read_method(other)
            assert m.channel == 1 and m.id == reply, (i, m)
    other.close()


@test
def auto_delete_queue_deleted_when_consumer_channel_closes():
    c = pika_connect()
    ch = c.channel()
    name = uniq("ad")
    ch.queue_declare(name, auto_delete=True)
    ch.basic_consume(name, lambda *a: None)
    ch.close()
    wait_until(lambda: _missing(name), what="auto-delete queue deleted")


@test
def reserved_amq_queue_name_is_403():
    ch = chan()
    eq(expect_channel_error(ACCESS_REFUSED, ch.queue_declare, "amq.x"),
       "ACCESS_REFUSED - queue name 'amq.x' contains reserved prefix 'amq.*'")
    # passive declare of an amq.* name is just a lookup -> 404
    ch = chan()
    eq(expect_channel_error(NOT_FOUND, ch.queue_declare, "amq.x", passive=True),
       "NOT_FOUND - no queue 'amq.x' in vhost '/'")


@test
def long_queue_name():
    ch = chan()
    ok = ch.queue_declare("q" * 255, exclusive=True).method
    eq(ok.queue, "q" * 255)


@test
def bind_errors_are_404():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    x = uniq("missing-x")
    eq(expect_channel_error(NOT_FOUND, ch.queue_bind, q, x, "k"),
       "NOT_FOUND - no exchange '%s' in vhost '/'" % x)
    ch = chan()
    mq = uniq("missing-q")
    eq(expect_channel_error(NOT_FOUND, ch.queue_bind, mq, "amq.direct", "k"),
       "NOT_FOUND - no queue '%s' in vhost '/'" % mq)


@test
def bind_and_unbind():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", "k1")
    ch.queue_bind(q, "amq.direct", "k1")            # duplicate bind is idempotent
    ch.basic_publish("amq.direct", "k1", b"one")
    eq(ch.queue_declare(q, passive=True).method.message_count, 1)
    ch.queue_unbind(q, "amq.direct", "k1")
    ch.basic_publish("amq.direct", "k1", b"two")
    eq(ch.queue_declare(q, passive=True).method.message_count, 1)
    # unbinding something that is not bound is ok
    ch.queue_unbind(q, "amq.direct", "never")
    # arguments are part of the binding identity
    ch.queue_bind(q, "amq.direct", "k2", arguments={"a": 1})
    ch.queue_unbind(q, "amq.direct", "k2")          # different args: no-op
    ch.basic_publish("amq.direct", "k2", b"three")
    eq(ch.queue_declare(q, passive=True).method.message_count, 2)
    ch.queue_unbind(q, "amq.direct", "k2", arguments={"a": 1})
    ch.basic_publish("amq.direct", "k2", b"four")
    eq(ch.queue_declare(q, passive=True).method.message_count, 2)


@test
def every_queue_is_bound_to_default_exchange():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    eq(ch.queue_declare(q, passive=True).method.message_count, 1)
    eq(expect_channel_error(ACCESS_REFUSED, ch.queue_unbind, q, "", q),
       "ACCESS_REFUSED - operation not permitted on the default exchange")


@test
def empty_queue_name_means_last_declared_on_channel():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    ch.queue_bind("", "amq.direct", "last-declared")
    ch.basic_publish("amq.direct", "last-declared", b"y")
    m, _, body = ch.basic_get("", auto_ack=True)
    eq((m.routing_key, body), (q, b"x"))
    eq(ch.queue_purge("").method.message_count, 1)
    ch.queue_delete("")
    expect_channel_error(NOT_FOUND, ch.queue_declare, q, passive=True)


@test
def empty_queue_name_without_prior_declare_raw():
    # On a channel that never declared a queue, "" has nothing to refer to.
    s = raw_connection()
    s.sendall(gen_basic_get(1, ""))
    code, text, cls, mth = expect_close(s, connection=False)
    eq((code, text, cls, mth), (NOT_FOUND, "NOT_FOUND - no previously declared queue", 60, 70))


if __name__ == "__main__":
    run()
