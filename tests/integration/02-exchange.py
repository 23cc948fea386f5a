"""02-exchange: exchange declare/delete/bind semantics and routing.

Goal: exchanges behave like RabbitMQ 3.10: the pre-declared exchanges, the
four types, equivalence checks, reserved names, if-unused deletion,
exchange-to-exchange bindings, topic and headers matching, internal and
auto-delete exchanges.

Method: pika BlockingConnection.  Routing is observed through exclusive
queues and basic.get, publishing in confirm mode so that a publish has been
routed before we look.  Expected reply codes and texts were observed on
RabbitMQ 3.10.8 (see RABBITMQ-NOTES.md).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403
import pika  # noqa: E402


def chan(confirm=True):
    ch = pika_connect().channel()
    if confirm:
        ch.confirm_delivery()
    return ch


def xq(ch, exchange, routing_key="", arguments=None):
    """An exclusive server-named queue bound to `exchange`."""
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, exchange, routing_key, arguments=arguments)
    return q


def drain(ch, q):
    out = []
    while True:
        m, props, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            return out
        out.append(body)


def routed(ch, queues, exchange, key, headers=None):
    """Publish one message and return the set of queue indexes it reached."""
    body = ("%s|%s" % (key, headers)).encode()
    ch.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers))
    hits = set()
    for i, q in enumerate(queues):
        got = drain(ch, q)
        assert got in ([], [body]), "queue %d got %r" % (i, got)
        if got:
            hits.add(i)
    return hits


@test
def predeclared_exchanges_exist():
    ch = chan(confirm=False)
    for name, type_ in (("amq.direct", "direct"), ("amq.fanout", "fanout"),
                        ("amq.topic", "topic"), ("amq.headers", "headers"),
                        ("amq.match", "headers")):
        ch.exchange_declare(name, passive=True)
        # they are durable: an identical active declare is fine
        ch.exchange_declare(name, type_, durable=True)
    # the default exchange routes by queue name ...
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"via default")
    eq(drain(ch, q), [b"via default"])
    # ... but any declare of it, even passive, is refused (RabbitMQ 3.10).
    eq(expect_channel_error(ACCESS_REFUSED, ch.exchange_declare, "", passive=True),
       "ACCESS_REFUSED - operation not permitted on the default exchange")


@test
def amq_direct_redeclared_non_durable_is_406():
    ch = chan(confirm=False)
    eq(expect_channel_error(PRECONDITION_FAILED, ch.exchange_declare, "amq.direct", "direct"),
       "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'amq.direct' in vhost "
       "'/': received 'false' but current is 'true'")


@test
def declare_each_type():
    ch = chan(confirm=False)
    for t in ("direct", "fanout", "topic", "headers"):
        name = uniq("x-" + t)
        ch.exchange_declare(name, t, auto_delete=False)
        ch.exchange_declare(name, t)           # idempotent
        ch.exchange_declare(name, passive=True)
        ch.exchange_delete(name)
        expect_channel_error(NOT_FOUND, ch.exchange_declare, name, passive=True)
        ch = chan(confirm=False)


@test
def unknown_exchange_type_is_connection_503():
    ch = chan(confirm=False)
    name = uniq("x-bogus")
    eq(expect_connection_error(COMMAND_INVALID, ch.exchange_declare, name, "bogus"),
       "COMMAND_INVALID - unknown exchange type 'bogus'")


@test
def passive_declare_of_missing_is_404():
    ch = chan(confirm=False)
    name = uniq("missing")
    eq(expect_channel_error(NOT_FOUND, ch.exchange_declare, name, passive=True),
       "NOT_FOUND - no exchange '%s' in vhost '/'" % name)


@test
def redeclare_with_different_properties_is_406():
    for kw, arg, recv, cur in (({"exchange_type": "fanout"}, "type", "fanout", "direct"),
                               ({"durable": True}, "durable", "true", "false"),
                               ({"auto_delete": True}, "auto_delete", "true", "false"),
                               ({"internal": True}, "internal", "true", "false")):
        ch = chan(confirm=False)
        name = uniq("x-eq")
        ch.exchange_declare(name, "direct")
        args = dict(exchange_type="direct")
        args.update(kw)
        eq(expect_channel_error(PRECONDITION_FAILED, ch.exchange_declare, name, **args),
           "PRECONDITION_FAILED - inequivalent arg '%s' for exchange '%s' in vhost '/': "
           "received '%s' but current is '%s'" % (arg, name, recv, cur))
        chan(confirm=False).exchange_delete(name)
    # Differing (non alternate-exchange) arguments are NOT checked for exchanges.
    ch = chan(confirm=False)
    name = uniq("x-eq")
    ch.exchange_declare(name, "direct")
    ch.exchange_declare(name, "direct", arguments={"foo": 1})
    ch.exchange_delete(name)


@test
def reserved_amq_prefix_is_403():
    ch = chan(confirm=False)
    eq(expect_channel_error(ACCESS_REFUSED, ch.exchange_declare, "amq.foo", "direct"),
       "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'")
    ch = chan(confirm=False)
    eq(expect_channel_error(ACCESS_REFUSED, ch.exchange_delete, "amq.direct"),
       "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")
    ch = chan(confirm=False)
    eq(expect_channel_error(ACCESS_REFUSED, ch.exchange_delete, ""),
       "ACCESS_REFUSED - operation not permitted on the default exchange")
    ch = chan(confirm=False)
    q = ch.queue_declare("", exclusive=True).method.queue
    eq(expect_channel_error(ACCESS_REFUSED, ch.queue_bind, q, "", "k"),
       "ACCESS_REFUSED - operation not permitted on the default exchange")


@test
def delete_of_missing_exchange_is_ok():
    # RabbitMQ 3.10: exchange.delete of a missing exchange succeeds.
    ch = chan(confirm=False)
    ch.exchange_delete(uniq("never-declared"))
    ch.exchange_declare("amq.direct", passive=True)  # channel still usable


@test
def delete_if_unused_with_binding_is_406():
    ch = chan(confirm=False)
    name = uniq("x-used")
    ch.exchange_declare(name, "direct")
    xq(ch, name, "k")
    eq(expect_channel_error(PRECONDITION_FAILED, ch.exchange_delete, name, if_unused=True),
       "PRECONDITION_FAILED - exchange '%s' in vhost '/' in use" % name)
    ch = chan(confirm=False)
    ch.exchange_delete(name)            # unconditional delete works
    expect_channel_error(NOT_FOUND, ch.exchange_declare, name, passive=True)


@test
def delete_if_unused_counts_only_outgoing_bindings():
    ch = chan(confirm=False)
    src, dst = uniq("x-src"), uniq("x-dst")
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(dst, src, "k")
    eq(expect_channel_error(PRECONDITION_FAILED, ch.exchange_delete, src, if_unused=True),
       "PRECONDITION_FAILED - exchange '%s' in vhost '/' in use" % src)
    ch = chan(confirm=False)
    ch.exchange_delete(dst, if_unused=True)   # only a destination: "unused"
    ch.exchange_delete(src, if_unused=True)   # its binding went with dst
    expect_channel_error(NOT_FOUND, ch.exchange_declare, src, passive=True)


@test
def exchange_to_exchange_bind_and_unbind():
    ch = chan()
    src, dst = uniq("e2e-src"), uniq("e2e-dst")
    ch.exchange_declare(src, "direct", auto_delete=False)
    ch.exchange_declare(dst, "fanout", auto_delete=False)
    try:
        q = xq(ch, dst)
        ch.exchange_bind(dst, src, "k1")
        eq(routed(ch, [q], src, "k1"), {0})
        eq(routed(ch, [q], src, "k2"), set())
        ch.exchange_unbind(dst, src, "k1")
        eq(routed(ch, [q], src, "k1"), set())
        # unbinding a binding that does not exist is fine
        ch.exchange_unbind(dst, src, "k1")
        # missing source / destination -> 404
        missing = uniq("missing")
        eq(expect_channel_error(NOT_FOUND, ch.exchange_bind, dst, missing, "k"),
           "NOT_FOUND - no exchange '%s' in vhost '/'" % missing)
        ch = chan()
        expect_channel_error(NOT_FOUND, ch.exchange_bind, missing, src, "k")
    finally:
        ch = chan(confirm=False)
        ch.exchange_delete(src)
        ch.exchange_delete(dst)


@test
def exchange_binding_cycle_delivers_once():
    ch = chan()
    a, b = uniq("cyc-a"), uniq("cyc-b")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    try:
        ch.exchange_bind(b, a)
        ch.exchange_bind(a, b)
        q1, q2 = xq(ch, a), xq(ch, b)
        ch.basic_publish(a, "", b"once")
        eq(drain(ch, q1), [b"once"])
        eq(drain(ch, q2), [b"once"])
        # two routes to one queue still deliver once
        q3 = xq(ch, a)
        ch.queue_bind(q3, b)
        ch.basic_publish(b, "", b"once more")
        eq(drain(ch, q3), [b"once more"])
    finally:
        ch = chan(confirm=False)
        ch.exchange_delete(a)
        ch.exchange_delete(b)


@test
def direct_and_fanout_routing():
    ch = chan()
    qa, qb, qab = xq(ch, "amq.direct", "a"), xq(ch, "amq.direct", "b"), xq(ch, "amq.direct", "a")
    ch.queue_bind(qab, "amq.direct", "b")
    eq(routed(ch, [qa, qb, qab], "amq.direct", "a"), {0, 2})
    eq(routed(ch, [qa, qb, qab], "amq.direct", "b"), {1, 2})
    eq(routed(ch, [qa, qb, qab], "amq.direct", "c"), set())
    f1, f2 = xq(ch, "amq.fanout", "ignored"), xq(ch, "amq.fanout", "")
    eq(routed(ch, [f1, f2], "amq.fanout", "anything"), {0, 1})


TOPIC_PATTERNS = ["*", "#", "a.*", "a.#", "a.#.b", "a..b", "*.b", "#.b", "a.*.#",
                  "", "a", "#.#", "a.*.*"]
TOPIC_CASES = {  # key -> indexes of TOPIC_PATTERNS that match (RabbitMQ 3.10)
    "a":       {0, 1, 3, 10, 11},
    "a.b":     {1, 2, 3, 4, 6, 7, 8, 11},
    "a.x.b":   {1, 3, 4, 7, 8, 11, 12},
    "a.x.y.b": {1, 3, 4, 7, 8, 11},
    "a..b":    {1, 3, 4, 5, 7, 8, 11, 12},
    "a.":      {1, 2, 3, 8, 11},
    "b":       {0, 1, 7, 11},
    "x.b":     {1, 6, 7, 11},
    "":        {1, 9, 11},          # "" is zero words: "*" does not match
    "a.b.c":   {1, 3, 8, 11, 12},
}


@test
def topic_routing():
    ch = chan()
    queues = [xq(ch, "amq.topic", p) for p in TOPIC_PATTERNS]
    for key, expected in TOPIC_CASES.items():
        got = routed(ch, queues, "amq.topic", key)
        eq(sorted(TOPIC_PATTERNS[i] for i in got), sorted(TOPIC_PATTERNS[i] for i in expected),
           "patterns matching key %r" % key)


@test
def headers_routing():
    ch = chan()
    bindings = [
        {"x-match": "all", "a": 1, "b": "two"},          # 0
        {"x-match": "any", "a": 1, "b": "two"},          # 1
        {"a": 1},                                          # 2 default is all
        {"x-match": "all", "a": 1, "x-foo": "bar"},      # 3 x- keys ignored
        {"x-match": "any", "x-foo": "bar"},              # 4 only x- keys: any -> never
        {"x-match": "all", "x-foo": "bar"},              # 5 only x- keys: all -> always
        {"x-match": "all"},                              # 6 empty all -> always
        {"x-match": "any"},                              # 7 empty any -> never
    ]
    queues = [xq(ch, "amq.headers", "ignored", arguments=b) for b in bindings]
    cases = [
        ({"a": 1, "b": "two"}, {0, 1, 2, 3, 5, 6}),
        ({"a": 1}, {1, 2, 3, 5, 6}),
        ({"a": 1, "b": "two", "c": 3}, {0, 1, 2, 3, 5, 6}),
        ({"b": "two"}, {1, 5, 6}),
        ({"a": "1"}, {5, 6}),                 # type matters: string "1" != int 1
        ({"a": 2}, {5, 6}),
        ({"x-foo": "bar"}, {5, 6}),
        ({}, {5, 6}),
        (None, {5, 6}),
    ]
    for headers, expected in cases:
        eq(routed(ch, queues, "amq.headers", "rk", headers), expected,
           "bindings matching headers %r" % (headers,))
    # amq.match is a second headers exchange
    q = xq(ch, "amq.match", "", arguments={"x-match": "any", "k": "v"})
    eq(routed(ch, [q], "amq.match", "", {"k": "v"}), {0})


@test
def headers_invalid_x_match_is_406():
    ch = chan(confirm=False)
    q = ch.queue_declare("", exclusive=True).method.queue
    eq(expect_channel_error(PRECONDITION_FAILED, ch.queue_bind, q, "amq.headers", "",
                            arguments={"x-match": "foo"}),
       'PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; expected all, any, '
       'all-with-x, or any-with-x')


@test
def internal_exchange_refuses_direct_publish():
    ch = chan(confirm=False)
    name = uniq("x-internal")
    ch.exchange_declare(name, "fanout", internal=True)
    try:
        ch.basic_publish(name, "", b"x")
        # the error arrives asynchronously; a synchronous call surfaces it
        eq(expect_channel_error(ACCESS_REFUSED, ch.queue_declare, "", exclusive=True),
           "ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'" % name)
        # ...but it routes what arrives through an exchange binding
        ch = chan()
        q = xq(ch, name)
        ch.exchange_bind(name, "amq.fanout")
        ch.basic_publish("amq.fanout", "", b"through")
        eq(drain(ch, q), [b"through"])
        ch.exchange_unbind(name, "amq.fanout")
    finally:
        chan(confirm=False).exchange_delete(name)


@test
def publish_to_missing_exchange_is_404():
    ch = chan(confirm=False)
    name = uniq("missing")
    ch.basic_publish(name, "k", b"x")
    eq(expect_channel_error(NOT_FOUND, ch.queue_declare, "", exclusive=True),
       "NOT_FOUND - no exchange '%s' in vhost '/'" % name)


@test
def auto_delete_exchange_goes_with_last_binding():
    ch = chan(confirm=False)
    # (a) queue unbind
    name = uniq("x-ad")
    ch.exchange_declare(name, "fanout", auto_delete=True)
    ch.exchange_declare(name, passive=True)          # never bound: still there
    q1, q2 = xq(ch, name), xq(ch, name)
    ch.queue_unbind(q1, name, "")
    ch.exchange_declare(name, passive=True)          # one binding left
    ch.queue_unbind(q2, name, "")
    expect_channel_error(NOT_FOUND, ch.exchange_declare, name, passive=True)
    # (b) deleting the bound queue
    ch = chan(confirm=False)
    name = uniq("x-ad")
    ch.exchange_declare(name, "fanout", auto_delete=True)
    q = xq(ch, name)
    ch.queue_delete(q)
    expect_channel_error(NOT_FOUND, ch.exchange_declare, name, passive=True)
    # (c) exchange-to-exchange: only bindings where it is the *source* count
    ch = chan(confirm=False)
    src, dst = uniq("x-ad-src"), uniq("x-ad-dst")
    ch.exchange_declare(src, "fanout", auto_delete=True)
    ch.exchange_declare(dst, "fanout", auto_delete=True)
    ch.exchange_bind(dst, src)
    ch.exchange_unbind(dst, src)
    expect_channel_error(NOT_FOUND, ch.exchange_declare, src, passive=True)
    ch = chan(confirm=False)
    ch.exchange_declare(dst, passive=True)           # was only a destination
    ch.exchange_delete(dst)


@test
def auto_delete_cascades_as_rabbitmq_does():
    """An auto-delete exchange goes with its last binding as a source,
    whether an unbind, its destination queue's deletion or its destination
    exchange's deletion removed it, and so on down a chain (RabbitMQ 3.10's
    remove_for_destination); a cycle keeps itself until broken. In a
    cluster every broker agrees at once (the map decides)."""
    c = pika_connect()
    ch = c.channel()
    src, dst, a, b, q = (uniq(x) for x in ("src", "dst", "a", "b", "q"))

    def exists(name):
        probe = c.channel()
        try:
            probe.exchange_declare(name, passive=True)
            probe.close()
            return True
        except pika.exceptions.ChannelClosedByBroker as e:
            eq(e.reply_code, NOT_FOUND)
            return False

    ch.exchange_declare(src, "direct", auto_delete=True)
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(destination=dst, source=src, routing_key="k")
    ch.exchange_delete(dst)
    eq(exists(src), False, "source of a deleted destination exchange")
    # A chain: a -> b -> q, a -> plain, b -> a (a cycle).
    plain = uniq("plain")
    ch.exchange_declare(a, "direct", auto_delete=True)
    ch.exchange_declare(b, "direct", auto_delete=True)
    ch.exchange_declare(plain, "fanout")
    ch.queue_declare(q)
    ch.exchange_bind(destination=b, source=a, routing_key="x")
    ch.queue_bind(q, b, "x")
    ch.exchange_bind(destination=plain, source=a, routing_key="y")
    ch.exchange_bind(destination=a, source=b, routing_key="z")
    ch.queue_delete(q)
    eq((exists(b), exists(a)), (True, True), "b still bound to a, a to b and plain")
    ch.exchange_delete(plain)
    eq((exists(a), exists(b)), (True, True), "a cycle keeps itself")
    ch.exchange_delete(b)
    eq(exists(a), False, "a, once its last binding (to b) went with b")
    # Declared again at once, it is a new exchange that routes (kombu's
    # SimpleBuffer declares an auto-delete exchange and queue anew like this).
    ch.exchange_declare(a, "direct", auto_delete=True)
    ch.queue_declare(q, auto_delete=True)
    ch.queue_bind(q, a, "k")
    ch.basic_publish(a, "k", b"again")
    eq(ch.basic_get(q, auto_ack=True)[2], b"again", "routed through the new exchange")
    ch.queue_delete(q)
    eq(exists(a), False, "gone with its queue")
    c.close()


if __name__ == "__main__":
    run()
