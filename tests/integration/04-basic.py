"""04-basic: the basic class -- publish, get, consume, ack/nack/reject, qos.

Goal: message flow behaves like RabbitMQ 3.10: get/get-empty fields,
mandatory returns, immediate (unsupported), consumer tags, exclusive
consumers, broker-initiated basic.cancel, acknowledgement errors, requeue
with redelivered=true, recover, per-consumer and global prefetch, FIFO order,
exact property round-trips, large and empty bodies.

Method: pika for ordinary flows; raw frames (quaytest) where exact
wire-level behaviour matters (frame order, reply codes, property bytes).
Expected codes/texts observed on RabbitMQ 3.10.8 (see RABBITMQ-NOTES.md).
"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403
import pika  # noqa: E402

CTAG_RE = r"amq\.ctag-[A-Za-z0-9_\-]{22}"


def chan(conn=None, confirm=True):
    ch = (conn or pika_connect()).channel()
    if confirm:
        ch.confirm_delivery()
    return ch


def fill(ch, q, n, prefix=b"m"):
    for i in range(n):
        ch.basic_publish("", q, prefix + b"%d" % i)


def pump(conn, until, timeout=5.0, what="deliveries"):
    """Run pika's I/O loop until `until()` is true."""
    deadline = time.time() + timeout
    while not until():
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        conn.process_data_events(time_limit=0.05)


def settle(conn, seconds=0.3):
    """Let in-flight deliveries arrive."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        conn.process_data_events(time_limit=0.05)


def raw_q(s, channel=1):
    return declare_queue(s, channel)[0]


# ------------------------------------------------------------ publish / get

@test
def publish_get_and_get_empty():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    eq(ch.basic_get(q), (None, None, None), "get on empty queue")
    fill(ch, q, 3)
    m, props, body = ch.basic_get(q, auto_ack=False)
    eq((m.delivery_tag, m.redelivered, m.exchange, m.routing_key, m.message_count, body),
       (1, False, "", q, 2, b"m0"))
    m, props, body = ch.basic_get(q, auto_ack=True)
    eq((m.delivery_tag, m.message_count, body), (2, 1, b"m1"))
    ch.basic_ack(1)


@test
def get_empty_raw_has_reserved_cluster_id():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_basic_get(1, q))
    m = expect_method(s, *BASIC_GET_EMPTY)
    eq(m.args.shortstr(), "", "get-empty reserved shortstr")


@test
def mandatory_unroutable_is_returned_before_confirm_ack():
    s = raw_connection()
    s.sendall(gen_confirm_select(1))
    expect_method(s, *CONFIRM_SELECT_OK)
    s.sendall(gen_publish(1, "", "no-such-queue", b"ret", mandatory=True))
    m = expect_method(s, *BASIC_RETURN, channel=1)
    eq((m.args.short(), m.args.shortstr(), m.args.shortstr(), m.args.shortstr()),
       (NO_ROUTE, "NO_ROUTE", "", "no-such-queue"), "basic.return fields")
    props, body, _ = read_content(s)
    eq(body, b"ret")
    m = expect_method(s, *BASIC_ACK, channel=1)
    eq((m.args.longlong(), m.args.bit()), (1, False), "ack after return")
    # fanout with no bindings, mandatory -> return as well
    x = uniq("x-empty")
    s.sendall(gen_exchange_declare(1, x, "fanout", auto_delete=False))
    expect_method(s, *EXCHANGE_DECLARE_OK)
    s.sendall(gen_publish(1, x, "rk", b"ret2", mandatory=True))
    m = expect_method(s, *BASIC_RETURN)
    eq((m.args.short(), m.args.shortstr(), m.args.shortstr(), m.args.shortstr()),
       (NO_ROUTE, "NO_ROUTE", x, "rk"))
    read_content(s)
    m = expect_method(s, *BASIC_ACK)
    eq(m.args.longlong(), 2)
    # non-mandatory unroutable: silently dropped, still acked
    s.sendall(gen_publish(1, "", "no-such-queue", b"drop"))
    m = expect_method(s, *BASIC_ACK)
    eq(m.args.longlong(), 3)
    # routable mandatory: no return
    q = raw_q(s)
    s.sendall(gen_publish(1, "", q, b"ok", mandatory=True))
    m = expect_method(s, *BASIC_ACK)
    eq(m.args.longlong(), 4)
    s.sendall(gen_method(1, 40, 20, short(0) + shortstr(x) + bits(False, False)))
    expect_method(s, 40, 21)


@test
def mandatory_without_confirms_pika():
    ch = chan(confirm=False)
    returned = []
    ch.add_on_return_callback(lambda c, method, props, body: returned.append(
        (method.reply_code, method.reply_text, method.exchange, method.routing_key, body)))
    ch.basic_publish("amq.direct", "nobody-home", b"bounce", mandatory=True)
    pump(ch.connection, lambda: returned, what="basic.return")
    eq(returned, [(312, "NO_ROUTE", "amq.direct", "nobody-home", b"bounce")])


@test
def immediate_flag_is_connection_540():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_publish(1, "", q, b"x", immediate=True))
    eq(expect_close(s, connection=True),
       (NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true", 60, 40))
    expect_closed_socket(s)


@test
def user_id_must_match_authenticated_user():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_publish(1, "", q, b"x", props={"user_id": "guest"}))
    eq(basic_get(s, 1, q, no_ack=True)["props"], {"user_id": "guest"})
    s.sendall(gen_publish(1, "", q, b"x", props={"user_id": "bob"}))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - user_id property set to 'bob' but "
        "authenticated user was 'guest'", 60, 40))


# ------------------------------------------------------------------ consume

@test
def consume_with_server_generated_tag():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_basic_consume(1, q, ""))
    tag = expect_method(s, *BASIC_CONSUME_OK).args.shortstr()
    assert re.fullmatch(CTAG_RE, tag), tag
    s.sendall(gen_publish(1, "", q, b"hello"))
    d = read_delivery(s)
    eq((d["consumer_tag"], d["delivery_tag"], d["redelivered"], d["exchange"],
        d["routing_key"], d["body"]), (tag, 1, False, "", q, b"hello"))
    s.sendall(gen_basic_ack(1, 1))
    # explicit tag is echoed
    s.sendall(gen_basic_consume(1, q, "my-tag"))
    eq(expect_method(s, *BASIC_CONSUME_OK).args.shortstr(), "my-tag")


@test
def duplicate_consumer_tag_is_connection_530():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_basic_consume(1, q, "t1"))
    expect_method(s, *BASIC_CONSUME_OK)
    s.sendall(gen_basic_consume(1, q, "t1"))
    eq(expect_close(s, connection=True),
       (NOT_ALLOWED, "NOT_ALLOWED - attempt to reuse consumer tag 't1'", 60, 20))


@test
def exclusive_consumer_blocks_others_with_403():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_basic_consume(1, q, "ex", exclusive=True))
    expect_method(s, *BASIC_CONSUME_OK)
    s.sendall(gen_channel_open(2) + gen_basic_consume(2, q, "second"))
    expect_method(s, *CHANNEL_OPEN_OK)
    eq(expect_close(s, connection=False),
       (ACCESS_REFUSED, "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % q, 60, 20))
    # basic.get is still allowed on a queue with an exclusive consumer
    s.sendall(gen_channel_open(3))
    expect_method(s, *CHANNEL_OPEN_OK)
    eq(basic_get(s, 3, q), None)
    # an exclusive consume on a queue that already has consumers is refused too
    q2 = raw_q(s, 3)
    s.sendall(gen_basic_consume(3, q2, "plain"))
    expect_method(s, *BASIC_CONSUME_OK)
    s.sendall(gen_basic_consume(3, q2, "wants-excl", exclusive=True))
    eq(expect_close(s, connection=False),
       (ACCESS_REFUSED, "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % q2,
        60, 20))


@test
def no_ack_consume_removes_messages():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append((m.delivery_tag, b)), auto_ack=True)
    fill(ch, q, 5)
    pump(ch.connection, lambda: len(got) == 5)
    eq(got, [(i + 1, b"m%d" % i) for i in range(5)])
    ch2 = chan(ch.connection)
    eq(ch2.queue_declare(q, passive=True).method.message_count, 0)


@test
def cancel_stops_deliveries():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_basic_consume(1, q, "c1", no_ack=True))
    expect_method(s, *BASIC_CONSUME_OK)
    s.sendall(gen_method(1, 60, 30, shortstr("c1") + bits(False)))
    eq(expect_method(s, *BASIC_CANCEL_OK).args.shortstr(), "c1")
    s.sendall(gen_publish(1, "", q, b"after cancel"))
    assert_no_frame(s, 0.3)
    eq(basic_get(s, 1, q, no_ack=True)["body"], b"after cancel")
    # cancelling an unknown tag is not an error: cancel-ok echoes the tag
    s.sendall(gen_method(1, 60, 30, shortstr("never-existed") + bits(False)))
    eq(expect_method(s, *BASIC_CANCEL_OK).args.shortstr(), "never-existed")


@test
def queue_deleted_while_consuming_sends_basic_cancel():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_basic_consume(1, q, "watcher"))
    expect_method(s, *BASIC_CONSUME_OK)
    # delete it from channel 2 (the queue is exclusive to this connection)
    s.sendall(gen_channel_open(2))
    expect_method(s, *CHANNEL_OPEN_OK)
    s.sendall(gen_queue_delete(2, q))
    got = [read_method(s), read_method(s)]   # cancel (ch 1) and delete-ok (ch 2), any order
    ids = sorted((m.channel, m.id) for m in got)
    eq(ids, [(1, BASIC_CANCEL), (2, QUEUE_DELETE_OK)])
    cancel = [m for m in got if m.id == BASIC_CANCEL][0]
    # RabbitMQ sets no-wait=true on the broker-sent basic.cancel
    eq((cancel.args.shortstr(), cancel.args.bit()), ("watcher", True),
       "basic.cancel consumer-tag / no-wait")
    # the channel stays usable
    raw_q(s, 1)


@test
def no_basic_cancel_without_consumer_cancel_notify_capability():
    s = raw_connection(capabilities={"authentication_failure_close": True})
    q = raw_q(s)
    s.sendall(gen_basic_consume(1, q, "quiet"))
    expect_method(s, *BASIC_CONSUME_OK)
    s.sendall(gen_channel_open(2) + gen_queue_delete(2, q))
    expect_method(s, *CHANNEL_OPEN_OK)
    expect_method(s, *QUEUE_DELETE_OK)
    assert_no_frame(s, 0.5)


# ----------------------------------------------------- ack / nack / reject

@test
def ack_single_and_multiple():
    s = raw_connection()
    q = raw_q(s)
    for i in range(5):
        s.sendall(gen_publish(1, "", q, b"%d" % i))
    tags = [basic_get(s, 1, q)["delivery_tag"] for _ in range(5)]
    eq(tags, [1, 2, 3, 4, 5])
    s.sendall(gen_basic_ack(1, 2))                 # single
    s.sendall(gen_basic_ack(1, 4, multiple=True))  # 1, 3, 4
    s.sendall(gen_channel_close(1))
    expect_method(s, *CHANNEL_CLOSE_OK)
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK)
    d = basic_get(s, 1, q, no_ack=True)           # only #5 was requeued
    eq((d["body"], d["redelivered"], d["message_count"]), (b"4", True, 0))


@test
def nack_and_reject_requeue_sets_redelivered():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 4)
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(4)]
    ch.basic_reject(tags[0], requeue=True)
    ch.basic_nack(tags[2], multiple=True, requeue=True)  # 2 and 3 (tag 1 is gone)
    ch.basic_nack(tags[3], multiple=False, requeue=True)
    got = []
    wait_until(lambda: _get_all(ch, q, got) and len(got) == 4, what="4 requeued")
    eq(sorted(b for _, b in got), [b"m0", b"m1", b"m2", b"m3"])
    assert all(r for r, _ in got), got
    # requeued messages keep their original order at the head of the queue
    eq([b for _, b in got], [b"m0", b"m1", b"m2", b"m3"])


def _get_all(ch, q, acc):
    while True:
        m, p, b = ch.basic_get(q, auto_ack=True)
        if m is None:
            return True
        acc.append((m.redelivered, b))


@test
def nack_and_reject_without_requeue_drop():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    ch.basic_reject(tags[0], requeue=False)
    ch.basic_nack(tags[2], multiple=True, requeue=False)
    time.sleep(0.2)
    eq(ch.basic_get(q), (None, None, None))
    eq(ch.queue_declare(q, passive=True).method.message_count, 0)


@test
def unknown_delivery_tag_is_406():
    for gen, ids in ((gen_basic_ack(1, 5), (60, 80)), (gen_basic_nack(1, 5), (60, 120)),
                     (gen_basic_reject(1, 5), (60, 90))):
        s = raw_connection()
        s.sendall(gen)
        eq(expect_close(s, connection=False),
           (PRECONDITION_FAILED, "PRECONDITION_FAILED - unknown delivery tag 5") + ids)
        s.sendall(gen_channel_open(1))          # connection survives
        expect_method(s, *CHANNEL_OPEN_OK)
    # tag 0 without multiple is unknown; with multiple=true it means "all"
    s = raw_connection()
    s.sendall(gen_basic_ack(1, 0))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - unknown delivery tag 0", 60, 80))
    s = raw_connection()
    s.sendall(gen_basic_ack(1, 0, multiple=True))
    raw_q(s)                                     # channel still open
    s.sendall(gen_basic_ack(1, 7, multiple=True))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - unknown delivery tag 7", 60, 80))


@test
def double_ack_is_406():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_publish(1, "", q, b"x"))
    eq(basic_get(s, 1, q)["delivery_tag"], 1)
    s.sendall(gen_basic_ack(1, 1) + gen_basic_ack(1, 1))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80))


@test
def ack_on_no_ack_delivery_is_406():
    s = raw_connection()
    q = raw_q(s)
    s.sendall(gen_publish(1, "", q, b"x"))
    eq(basic_get(s, 1, q, no_ack=True)["delivery_tag"], 1)
    s.sendall(gen_basic_ack(1, 1))
    eq(expect_close(s, connection=False)[0:2],
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - unknown delivery tag 1"))


@test
def recover_requeues_unacked():
    s = raw_connection()
    q = raw_q(s)
    for i in range(3):
        s.sendall(gen_publish(1, "", q, b"r%d" % i))
    for _ in range(3):
        basic_get(s, 1, q)
    s.sendall(gen_method(1, 60, 110, bits(True)))   # basic.recover requeue=true
    expect_method(s, 60, 111)
    got = [basic_get(s, 1, q) for _ in range(3)]
    eq([(d["body"], d["redelivered"], d["delivery_tag"]) for d in got],
       [(b"r0", True, 4), (b"r1", True, 5), (b"r2", True, 6)])
    # requeue=false is not implemented: connection error 540
    s.sendall(gen_method(1, 60, 110, bits(False)))
    eq(expect_close(s, connection=True),
       (NOT_IMPLEMENTED, "NOT_IMPLEMENTED - requeue=false", 60, 110))


@test
def recover_redelivers_to_consumer():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append((m.redelivered, b)))
    fill(ch, q, 2)
    pump(ch.connection, lambda: len(got) == 2)
    ch.basic_recover(requeue=True)
    pump(ch.connection, lambda: len(got) == 4)
    eq(got, [(False, b"m0"), (False, b"m1"), (True, b"m0"), (True, b"m1")])


# ---------------------------------------------------------------------- qos

@test
def prefetch_count_is_per_consumer_when_not_global():
    conn = pika_connect()
    pub = chan(conn)
    q1 = pub.queue_declare("", exclusive=True).method.queue
    q2 = pub.queue_declare("", exclusive=True).method.queue
    fill(pub, q1, 10)
    fill(pub, q2, 10)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)          # global=false: per consumer (3.10)
    got = {q1: [], q2: []}
    ch.basic_consume(q1, lambda c, m, p, b: got[q1].append(m.delivery_tag))
    ch.basic_consume(q2, lambda c, m, p, b: got[q2].append(m.delivery_tag))
    pump(conn, lambda: len(got[q1]) == 2 and len(got[q2]) == 2)
    settle(conn)
    eq((len(got[q1]), len(got[q2])), (2, 2), "deliveries per consumer with prefetch 2")
    ch.basic_ack(got[q1][0])
    pump(conn, lambda: len(got[q1]) == 3)
    settle(conn)
    eq((len(got[q1]), len(got[q2])), (3, 2))


@test
def prefetch_count_global_is_per_channel():
    conn = pika_connect()
    pub = chan(conn)
    q1 = pub.queue_declare("", exclusive=True).method.queue
    q2 = pub.queue_declare("", exclusive=True).method.queue
    fill(pub, q1, 10)
    fill(pub, q2, 10)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got = []
    ch.basic_consume(q1, lambda c, m, p, b: got.append(m.delivery_tag))
    ch.basic_consume(q2, lambda c, m, p, b: got.append(m.delivery_tag))
    pump(conn, lambda: len(got) == 3)
    settle(conn)
    eq(len(got), 3, "deliveries on channel with global prefetch 3")
    ch.basic_ack(got[-1], multiple=True)
    pump(conn, lambda: len(got) == 6)
    settle(conn)
    eq(len(got), 6)


@test
def prefetch_count_zero_is_unlimited_and_qos_applies_to_later_consumers():
    conn = pika_connect()
    pub = chan(conn)
    q = pub.queue_declare("", exclusive=True).method.queue
    fill(pub, q, 50)
    ch = conn.channel()
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    pump(conn, lambda: len(got) == 50)
    ch.basic_nack(0, multiple=True, requeue=True)   # tag 0 + multiple: all outstanding
    ch.close()
    ch = conn.channel()
    got = []
    ch.basic_qos(prefetch_count=5)
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    pump(conn, lambda: len(got) == 5)
    settle(conn)
    eq(len(got), 5)


@test
def prefetch_size_is_connection_540():
    s = raw_connection()
    s.sendall(gen_basic_qos(1, 10, prefetch_size=1000))
    eq(expect_close(s, connection=True),
       (NOT_IMPLEMENTED, "NOT_IMPLEMENTED - prefetch_size!=0 (1000)", 60, 10))


# -------------------------------------------------------- requeue on close

@test
def unacked_requeued_on_channel_close():
    conn = pika_connect()
    ch = chan(conn)
    q = ch.queue_declare("", exclusive=True).method.queue
    fill(ch, q, 3)
    ch2 = conn.channel()
    got = []
    ch2.basic_consume(q, lambda c, m, p, b: got.append(b))
    pump(conn, lambda: len(got) == 3)
    ch2.close()
    out = []
    wait_until(lambda: _get_all(ch, q, out) and len(out) == 3, what="requeue on close")
    eq(out, [(True, b"m0"), (True, b"m1"), (True, b"m2")])


@test
def unacked_requeued_on_connection_close():
    ch = chan()
    name = uniq("q")
    ch.queue_declare(name, auto_delete=False)
    try:
        fill(ch, name, 2)
        c2 = pika_connect()
        ch2 = c2.channel()
        m, _, b = ch2.basic_get(name)
        eq(b, b"m0")
        c2.close()
        out = []
        wait_until(lambda: _get_all(ch, name, out) and len(out) == 2, what="requeue")
        eq(out, [(True, b"m0"), (False, b"m1")])
    finally:
        ch.queue_delete(name)


# -------------------------------------------------------- ordering / content

@test(timeout=120)
def fifo_order_10k_messages():
    conn = pika_connect()
    ch = chan(conn, confirm=False)
    q = ch.queue_declare("", exclusive=True).method.queue
    n = 10000
    for i in range(n):
        ch.basic_publish("", q, b"%d" % i)
    got = []
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=500)

    def on_msg(c, m, p, b):
        got.append(int(b))
        if len(got) % 100 == 0:
            c.basic_ack(m.delivery_tag, multiple=True)
    ch2.basic_consume(q, on_msg)
    pump(conn, lambda: len(got) == n, timeout=100, what="10k messages")
    eq(got, list(range(n)), "FIFO order")


ALL_PROPS = {
    "content_type": "application/x-quay",
    "content_encoding": "gzip",
    "headers": {"str": "v", "int": 42, "neg": -7, "big": 2 ** 40, "bool": True,
                "float": 1.5, "bytes": b"\x00\xff", "nested": {"a": [1, "two", None]},
                "ts": Timestamp(1700000000), "dec": Decimal((2, 12345)), "void": None},
    "delivery_mode": 2,
    "priority": 7,
    "correlation_id": "corr-1",
    "reply_to": "reply.queue",
    "expiration": "600000",
    "message_id": "msg-1",
    "timestamp": 1700000001,
    "type": "t.type",
    "user_id": "guest",
    "app_id": "quaytest",
    "cluster_id": "cl-1",
}


@test
def all_fourteen_properties_round_trip_byte_exact():
    s = raw_connection()
    q = raw_q(s)
    sent_header = gen_content_header(1, 4, ALL_PROPS)[7:-1]    # payload of the frame
    s.sendall(gen_publish(1, "", q, b"body", props=ALL_PROPS))
    d = basic_get(s, 1, q, no_ack=True)
    eq(d["body"], b"body")
    eq(d["props"], ALL_PROPS, "decoded properties")
    eq(d["raw_header"], sent_header, "content header bytes")
    # the same through a consumer
    s.sendall(gen_publish(1, "", q, b"body", props=ALL_PROPS))
    s.sendall(gen_basic_consume(1, q, "c", no_ack=True))
    expect_method(s, *BASIC_CONSUME_OK)
    d = read_delivery(s)
    eq(d["raw_header"], sent_header, "content header bytes (deliver)")


@test
def properties_round_trip_pika():
    ch = chan()
    q = ch.queue_declare("", exclusive=True).method.queue
    props = pika.BasicProperties(
        content_type="text/plain", content_encoding="utf-8",
        headers={"a": 1, "b": "two", "c": [1, 2], "d": {"e": True}},
        delivery_mode=1, priority=3, correlation_id="c", reply_to="r", expiration="100000",
        message_id="m", timestamp=123456789, type="ty", user_id="guest", app_id="ap",
        cluster_id="cl")
    ch.basic_publish("", q, b"x", props)
    m, p, body = ch.basic_get(q, auto_ack=True)
    for k in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
              "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
              "user_id", "app_id", "cluster_id"):
        eq(getattr(p, k), getattr(props, k), k)


@test
def large_message_spanning_many_frames():
    s = raw_connection()
    q = raw_q(s)
    body = os.urandom(1 << 20)
    s.sendall(gen_publish(1, "", q, body))
    d = basic_get(s, 1, q, no_ack=True)
    eq(len(d["body"]), len(body))
    assert d["body"] == body, "1 MiB body differs"
    # via pika with a small frame_max, consumed
    conn = pika_connect(frame_max=8192)
    ch = chan(conn)
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q2, body)
    got = []
    ch.basic_consume(q2, lambda c, m, p, b: got.append(b), auto_ack=True)
    pump(conn, lambda: got)
    assert got[0] == body, "1 MiB body differs (pika, frame_max 8192)"


@test
def zero_length_body():
    s = raw_connection()
    q = raw_q(s)
    # header with body-size 0 and no body frame at all
    s.sendall(gen_basic_publish(1, "", q) + gen_content_header(1, 0, {"type": "empty"}))
    s.sendall(gen_basic_get(1, q, no_ack=True))
    expect_method(s, *BASIC_GET_OK)
    ftype, ch, payload = read_frame(s)
    eq(ftype, FRAME_HEADER)
    eq(Reader(payload, 4).longlong(), 0, "body size")
    assert_no_frame(s, 0.3)      # no (empty) body frame follows
    ch = chan()
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q2, b"")
    m, p, b = ch.basic_get(q2, auto_ack=True)
    eq(b, b"")


@test
def raising_the_prefetch_releases_more_at_once():
    """A new basic.qos global=true applies to the channel's consumers at
    once: raising it delivers more right away (through a proxy the primary
    is told); global=false applies to consumers made after it only
    (RabbitMQ 3.10), so raising it releases nothing."""
    for glob in (True, False):
        s = raw_connection()
        q = raw_q(s)
        for i in range(5):
            s.sendall(gen_publish(1, "", q, b"m%d" % i))
        s.sendall(gen_basic_qos(1, 1, global_=glob))
        expect_method(s, *BASIC_QOS_OK)
        s.sendall(gen_basic_consume(1, q, "c"))
        expect_method(s, *BASIC_CONSUME_OK)
        eq(read_delivery(s)["body"], b"m0", "first")
        assert_no_frame(s, 0.3)
        s.sendall(gen_basic_qos(1, 3, global_=glob))
        expect_method(s, *BASIC_QOS_OK)
        if glob:
            eq([read_delivery(s)["body"] for _ in range(2)], [b"m1", b"m2"], "released")
        assert_no_frame(s, 0.5)
        s.close()


if __name__ == "__main__":
    run()
