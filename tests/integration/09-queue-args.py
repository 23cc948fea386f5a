"""09-queue-args: RabbitMQ's queue/exchange/consumer extensions.

Goal: message TTL (queue x-message-ttl and per-message expiration), queue
expiry (x-expires), length limits (x-max-length, x-max-length-bytes) with the
three x-overflow behaviours, dead-lettering (x-dead-letter-exchange /
-routing-key, the exact x-death and x-first-death-* headers, cycle drop),
priority queues, single-active-consumer, lazy mode, consumer priorities,
alternate exchanges, internal exchanges, and the exact 406 texts for
ill-typed or invalid arguments all behave like RabbitMQ 3.10.

Method: raw frames (quaytest) almost everywhere, because the tests check
field types inside x-death (timestamp 'T', long 'l', array 'A'), exact
confirm tags and exact close texts.  Every expectation was first observed on
RabbitMQ 3.10.8 (see RABBITMQ-NOTES.md, section "Queue arguments").
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403


# ---------------------------------------------------------------- helpers

class TypedReader(Reader):
    """Like Reader, but field-table values come back as (type_char, value)."""

    def table(self):
        sub = TypedReader(self.longstr())
        out = {}
        while sub.pos < len(sub.data):
            k = sub.shortstr()
            out[k] = sub.value()
        return out

    def value(self):
        t = self.data[self.pos:self.pos + 1].decode()
        if t == "F":
            self.take(1)
            return (t, self.table())
        if t == "A":
            self.take(1)
            sub = TypedReader(self.longstr())
            items = []
            while sub.pos < len(sub.data):
                items.append(sub.value())
            return (t, items)
        return (t, Reader.value(self))


def typed_headers(raw_header):
    """The headers table of a content-header payload, with type chars."""
    r = TypedReader(raw_header)
    r.short(), r.short(), r.longlong()
    return decode_properties(r).get("headers", {})


def untype(v):
    t, x = v
    if t == "F":
        return {k: untype(y) for k, y in x.items()}
    if t == "A":
        return [untype(y) for y in x]
    return x


class Ch:
    """A raw connection with channel 1 open (confirm mode by default) that
    tracks confirms and basic.returns."""

    def __init__(self, confirm=True):
        self.s = raw_connection()
        self.seq = 0
        self.acked, self.nacked, self.returns = set(), set(), []
        self.confirm = confirm
        if confirm:
            self.s.sendall(gen_confirm_select(1))
            expect_method(self.s, *CONFIRM_SELECT_OK, channel=1)

    def declare(self, name="", args=None, exclusive=True, **kw):
        return declare_queue(self.s, 1, name, exclusive=exclusive, arguments=args, **kw)

    def queue(self, args=None, **kw):
        return self.declare(uniq("q"), args, **kw)[0]

    def count(self, q):
        return declare_queue(self.s, 1, q, passive=True)[1]

    def exchange(self, type_="direct", name=None, args=None, internal=False):
        name = name or uniq("x")
        self.s.sendall(gen_exchange_declare(1, name, type_, auto_delete=False,
                                            internal=internal, arguments=args))
        expect_method(self.s, *EXCHANGE_DECLARE_OK, channel=1)
        return name

    def delete_exchange(self, name):
        self.s.sendall(gen_method(1, 40, 20, short(0) + shortstr(name) + bits(False, False)))
        expect_method(self.s, 40, 21, channel=1)

    def bind(self, q, x, rk=""):
        self.s.sendall(gen_queue_bind(1, q, x, rk))
        expect_method(self.s, *QUEUE_BIND_OK, channel=1)

    def publish(self, rk, body, props=None, exchange="", mandatory=False, wait=True):
        self.s.sendall(gen_publish(1, exchange, rk, body, props, mandatory))
        self.seq += 1
        if wait and self.confirm:
            self.wait_confirms()
        return self.seq

    def wait_confirms(self, timeout=5.0):
        deadline = time.time() + timeout
        while len(self.acked) + len(self.nacked) < self.seq:
            m = read_method(self.s, max(0.01, deadline - time.time()))
            if m.id == BASIC_RETURN:
                a = m.args
                ret = (a.short(), a.shortstr(), a.shortstr(), a.shortstr())
                self.returns.append(ret + (read_content(self.s)[1],))
                continue
            if m.id not in (BASIC_ACK, BASIC_NACK):
                raise ProtocolError("expected ack/nack, got %r" % m)
            tag, multiple = m.args.longlong(), m.args.bit()
            tags = set(range(1, tag + 1)) if multiple else {tag}
            tags -= self.acked | self.nacked
            (self.acked if m.id == BASIC_ACK else self.nacked).update(tags)

    def get(self, q, no_ack=True):
        return basic_get(self.s, 1, q, no_ack)

    def bodies(self, q):
        out = []
        while True:
            g = self.get(q)
            if g is None:
                return out
            out.append(g["body"])

    def wait_count(self, q, n, timeout, what=None):
        """Poll passive declare until message_count == n; return elapsed s."""
        t0 = time.time()
        wait_until(lambda: self.count(q) == n, timeout, 0.05,
                   what or "message_count of %s to become %d (now %d)" % (q, n, self.count(q)))
        return time.time() - t0


def xdeath(d):
    """x-death entries of a delivery/get dict, typed."""
    h = typed_headers(d["raw_header"])
    assert "x-death" in h, "no x-death header in %r" % (h,)
    t, entries = h["x-death"]
    eq(t, "A", "x-death field type")
    return [e[1] for e in entries], h


def check_death(entry, count, reason, queue, exchange, routing_keys, expiration=None,
                before=None):
    """Assert one x-death entry exactly, including field types."""
    keys = {"count", "reason", "queue", "time", "exchange", "routing-keys"}
    if expiration is not None:
        keys.add("original-expiration")
    eq(set(entry), keys, "x-death entry keys")
    eq(entry["count"], ("l", count), "x-death count")
    eq(entry["reason"], ("S", reason), "x-death reason")
    eq(entry["queue"], ("S", queue), "x-death queue")
    eq(entry["exchange"], ("S", exchange), "x-death exchange")
    eq(entry["routing-keys"][0], "A", "routing-keys type")
    eq(untype(entry["routing-keys"]), routing_keys, "x-death routing-keys")
    eq(entry["time"][0], "T", "x-death time type")
    now = time.time()
    assert now - 120 < entry["time"][1] <= now + 2, "x-death time %r not ~now" % (entry["time"],)
    if expiration is not None:
        eq(entry["original-expiration"], ("S", expiration), "original-expiration")


def check_first_death(h, reason, queue, exchange):
    eq(h.get("x-first-death-reason"), ("S", reason), "x-first-death-reason")
    eq(h.get("x-first-death-queue"), ("S", queue), "x-first-death-queue")
    eq(h.get("x-first-death-exchange"), ("S", exchange), "x-first-death-exchange")


def dlx_setup(c, dl_rk=None, qargs=None, shared=False):
    """Source queue Q (bound to direct exchange X with key 'rk1') whose
    dead-letter exchange is a fanout DLX bound to queue DQ."""
    dlx = c.exchange("fanout")
    dq = c.queue()
    c.bind(dq, dlx)
    args = {"x-dead-letter-exchange": dlx}
    if dl_rk is not None:
        args["x-dead-letter-routing-key"] = dl_rk
    args.update(qargs or {})
    q = c.queue(args, exclusive=not shared, auto_delete=shared)
    x = c.exchange("direct")
    c.bind(q, x, "rk1")
    return x, q, dlx, dq


def declare_error(args, exclusive=True):
    s = raw_connection()
    name = uniq("bad")
    s.sendall(gen_queue_declare(1, name, exclusive=exclusive, arguments=args))
    return name, expect_close(s, connection=False)


# ---------------------------------------------------------------- TTL

@test
def message_ttl_expires_and_count_drops_promptly():
    """x-message-ttl: messages leave a consumer-less queue within ~1 s of expiry."""
    c = Ch()
    q = c.queue({"x-message-ttl": 500})
    t0 = time.time()
    for i in range(3):
        c.publish(q, b"m%d" % i)
    eq(c.count(q), 3, "count right after publishing")
    c.wait_count(q, 0, 0.5 + 1.0 - (time.time() - t0) + 0.3)
    assert time.time() - t0 >= 0.45, "expired too early (%.2f s)" % (time.time() - t0)
    eq(c.get(q), None, "get after expiry")


@test
def message_ttl_zero_delivers_only_to_a_ready_consumer():
    """x-message-ttl=0: no consumer -> dead-lettered (expired); consumer -> delivered."""
    c = Ch()
    x, q, dlx, dq = dlx_setup(c, qargs={"x-message-ttl": 0}, shared=True)
    c.publish("rk1", b"nobody", exchange=x)
    c.wait_count(dq, 1, 2.0)
    eq(c.count(q), 0)
    d = c.get(dq)
    eq(d["body"], b"nobody")
    entries, h = xdeath(d)
    eq(len(entries), 1)
    check_death(entries[0], 1, "expired", q, x, ["rk1"])
    # with a consumer ready, the message is delivered
    s2 = raw_connection()
    s2.sendall(gen_basic_consume(1, q, "c1", no_ack=True))
    expect_method(s2, *BASIC_CONSUME_OK)
    c.publish("rk1", b"somebody", exchange=x)
    eq(read_delivery(s2)["body"], b"somebody")
    time.sleep(0.2)
    eq(c.count(dq), 0, "nothing more dead-lettered")


@test
def per_message_expiration_expires_promptly():
    """expiration property on a queue without TTL; smaller of the two TTLs wins."""
    c = Ch()
    q = c.queue()
    t0 = time.time()
    c.publish(q, b"short", {"expiration": "400"})
    eq(c.count(q), 1)
    c.wait_count(q, 0, 0.4 + 1.0)
    assert time.time() - t0 >= 0.35, "expired too early"
    # queue TTL 60 s, message 300 ms -> message's wins
    q2 = c.queue({"x-message-ttl": 60000})
    c.publish(q2, b"m", {"expiration": "300"})
    c.wait_count(q2, 0, 0.3 + 1.0)
    # queue TTL 300 ms, message 60 s -> queue's wins
    q3 = c.queue({"x-message-ttl": 300})
    c.publish(q3, b"m", {"expiration": "60000"})
    c.wait_count(q3, 0, 0.3 + 1.0)
    # expiration "0": gone at once without a consumer
    c.publish(q, b"zero", {"expiration": "0"})
    c.wait_count(q, 0, 1.0)
    eq(c.get(q), None)


@test
def per_message_expiration_unexpired_message_keeps_its_property():
    """A message fetched before expiry carries its expiration property unchanged."""
    c = Ch()
    q = c.queue()
    c.publish(q, b"m", {"expiration": "60000"})
    d = c.get(q)
    eq(d["props"].get("expiration"), "60000")


@test
def invalid_expiration_is_406_with_rabbitmq_text():
    """Invalid expiration strings close the channel with RabbitMQ's exact text."""
    cases = [
        ("abc", "invalid expiration 'abc': no_integer"),
        ("", "invalid expiration '': no_integer"),
        (" 10", "invalid expiration ' 10': no_integer"),
        ("-1", "invalid expiration '-1': {value_negative,-1}"),
        ("1.5", "invalid expiration '1.5': {leftover_string,\".5\"}"),
        ("10 ", "invalid expiration '10 ': {leftover_string,\" \"}"),
        ("1e3", "invalid expiration '1e3': {leftover_string,\"e3\"}"),
    ]
    for exp, text in cases:
        s = raw_connection()
        q = declare_queue(s)[0]
        s.sendall(gen_publish(1, "", q, b"x", {"expiration": exp}))
        eq(expect_close(s, connection=False),
           (PRECONDITION_FAILED, "PRECONDITION_FAILED - " + text, 60, 40),
           "expiration %r" % exp)
        s.close()
    # accepted oddities: leading '+', leading zeros, values above 2^32
    c = Ch()
    q = c.queue()
    for exp in ("+60000", "0060000", "4294967296"):
        c.publish(q, b"ok", {"expiration": exp})
    eq(c.acked, {1, 2, 3})
    eq(c.count(q), 3)


# ---------------------------------------------------------------- x-expires

@test
def x_expires_deletes_unused_queue():
    """x-expires: an unused queue is deleted; one with a consumer is kept."""
    c = Ch()
    q = c.declare(uniq("exp"), {"x-expires": 500}, exclusive=False)[0]
    time.sleep(1.5)
    s = raw_connection()
    s.sendall(gen_queue_declare(1, q, passive=True))
    eq(expect_close(s, connection=False),
       (NOT_FOUND, "NOT_FOUND - no queue '%s' in vhost '/'" % q, 50, 10))
    # with a consumer it survives; after the cancel it expires
    q2 = c.declare(uniq("exp"), {"x-expires": 500}, exclusive=False)[0]
    s2 = raw_connection()
    s2.sendall(gen_basic_consume(1, q2, "c1"))
    expect_method(s2, *BASIC_CONSUME_OK)
    time.sleep(1.2)
    eq(c.count(q2), 0, "queue with a consumer still exists")
    s2.sendall(gen_method(1, 60, 30, shortstr("c1") + bits(False)))
    expect_method(s2, *BASIC_CANCEL_OK)
    time.sleep(1.5)
    s3 = raw_connection()
    s3.sendall(gen_queue_declare(1, q2, passive=True))
    eq(expect_close(s3, connection=False)[0], NOT_FOUND)


# ---------------------------------------------------------------- length limits

@test
def max_length_drop_head_dead_letters_oldest_with_reason_maxlen():
    """x-max-length=3 (default drop-head): oldest dropped and dead-lettered (maxlen)."""
    c = Ch()
    x, q, dlx, dq = dlx_setup(c, qargs={"x-max-length": 3})
    for i in range(5):
        c.publish("rk1", b"m%d" % i, exchange=x)
    eq(c.acked, {1, 2, 3, 4, 5})
    eq(c.count(q), 3)
    c.wait_count(dq, 2, 2.0)
    d0, d1 = c.get(dq), c.get(dq)
    eq((d0["body"], d1["body"]), (b"m0", b"m1"))
    entries, h = xdeath(d0)
    eq(len(entries), 1)
    check_death(entries[0], 1, "maxlen", q, x, ["rk1"])
    check_first_death(h, "maxlen", q, x)
    eq(c.bodies(q), [b"m2", b"m3", b"m4"])


@test
def max_length_bytes_drop_head_counts_body_bytes():
    """x-max-length-bytes=10: only body bytes count; oldest dropped first."""
    c = Ch()
    q = c.queue({"x-max-length-bytes": 10})
    big = {"headers": {"pad": "x" * 500}}   # properties do not count
    for b in (b"aaaa", b"bbbb", b"cccc"):
        c.publish(q, b, big)
    eq(c.bodies(q), [b"bbbb", b"cccc"])
    # a message that alone exceeds the limit does not stay
    c.publish(q, b"dddd")
    c.publish(q, b"x" * 11)
    eq(c.acked, set(range(1, 6)))
    eq(c.bodies(q), [])


@test
def max_length_zero_keeps_nothing():
    """x-max-length=0 (drop-head): every message is dropped at once, but acked."""
    c = Ch()
    q = c.queue({"x-max-length": 0})
    c.publish(q, b"a")
    eq(c.acked, {1})
    eq(c.count(q), 0)


@test
def reject_publish_nacks_exact_tags_and_does_not_dead_letter():
    """x-overflow=reject-publish: publishes beyond the limit are nacked, not dead-lettered."""
    c = Ch()
    x, q, dlx, dq = dlx_setup(c, qargs={"x-max-length": 2, "x-overflow": "reject-publish"})
    for i in range(5):
        c.publish("rk1", b"m%d" % i, exchange=x, wait=False)
    c.wait_confirms()
    eq((c.acked, c.nacked), ({1, 2}, {3, 4, 5}))
    eq(c.get(q)["body"], b"m0")     # frees one slot
    c.publish("rk1", b"m5", exchange=x)
    c.publish("rk1", b"m6", exchange=x)
    eq((c.acked, c.nacked), ({1, 2, 6}, {3, 4, 5, 7}))
    eq(c.bodies(q), [b"m1", b"m5"])
    time.sleep(0.2)
    eq(c.count(dq), 0, "reject-publish must not dead-letter")


@test
def reject_publish_by_bytes_nacks():
    """x-max-length-bytes with reject-publish: a publish that would exceed it is nacked."""
    c = Ch()
    q = c.queue({"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
    for b in (b"aaaa", b"bbbb", b"cccc", b"dd"):
        c.publish(q, b)
    eq((c.acked, c.nacked), ({1, 2, 4}, {3}))
    eq(c.bodies(q), [b"aaaa", b"bbbb", b"dd"])


@test
def reject_publish_dlx_nacks_and_dead_letters():
    """x-overflow=reject-publish-dlx: rejected publishes are nacked AND dead-lettered."""
    c = Ch()
    x, q, dlx, dq = dlx_setup(c, qargs={"x-max-length": 1,
                                         "x-overflow": "reject-publish-dlx"})
    for i in range(3):
        c.publish("rk1", b"m%d" % i, exchange=x, wait=False)
    c.wait_confirms()
    eq((c.acked, c.nacked), ({1}, {2, 3}))
    c.wait_count(dq, 2, 2.0)
    d = c.get(dq)
    eq(d["body"], b"m1")
    entries, h = xdeath(d)
    eq(len(entries), 1)
    check_death(entries[0], 1, "maxlen", q, x, ["rk1"])
    eq(c.get(dq)["body"], b"m2")
    eq(c.bodies(q), [b"m0"])


# ---------------------------------------------------------------- dead-lettering

@test
def reject_and_nack_without_requeue_dead_letter_with_full_x_death():
    """reject/nack requeue=false -> DLX; x-death and x-first-death-* exact."""
    c = Ch()
    x, q, dlx, dq = dlx_setup(c)
    for i in range(4):
        c.publish("rk1", b"m%d" % i, {"headers": {"app": "keep"}}, exchange=x)
    tags = [c.get(q, no_ack=False)["delivery_tag"] for _ in range(4)]
    c.s.sendall(gen_basic_reject(1, tags[0], requeue=False))
    c.s.sendall(gen_basic_nack(1, tags[2], multiple=True, requeue=False))  # tags 2,3
    c.s.sendall(gen_basic_nack(1, tags[3], requeue=True))                  # back to q
    c.wait_count(dq, 3, 2.0)
    got = [c.get(dq) for _ in range(3)]
    eq([g["body"] for g in got], [b"m0", b"m1", b"m2"])
    for g in got:
        eq((g["exchange"], g["routing_key"], g["redelivered"]), (dlx, "rk1", False),
           "dead-lettered delivery exchange/routing-key")
        entries, h = xdeath(g)
        eq(len(entries), 1)
        check_death(entries[0], 1, "rejected", q, x, ["rk1"])
        check_first_death(h, "rejected", q, x)
        eq(h.get("app"), ("S", "keep"), "other headers preserved")
        eq(set(h), {"app", "x-death", "x-first-death-reason", "x-first-death-queue",
                    "x-first-death-exchange"}, "header keys")
    eq(c.bodies(q), [b"m3"])


@test
def dead_letter_routing_key_replaces_key_but_not_x_death_routing_keys():
    """x-dead-letter-routing-key: new routing key; x-death keeps the original key."""
    c = Ch()
    dlx = c.exchange("direct")
    dq = c.queue()
    c.bind(dq, dlx, "newkey")
    q = c.queue({"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "newkey"})
    c.publish(q, b"m")
    g = c.get(q, no_ack=False)
    c.s.sendall(gen_basic_reject(1, g["delivery_tag"], requeue=False))
    c.wait_count(dq, 1, 2.0)
    d = c.get(dq)
    eq((d["exchange"], d["routing_key"]), (dlx, "newkey"))
    entries, h = xdeath(d)
    check_death(entries[0], 1, "rejected", q, "", [q])
    check_first_death(h, "rejected", q, "")


@test
def dead_letter_to_default_exchange_and_missing_dlx():
    """DLX "" routes by x-dead-letter-routing-key; a missing DLX drops silently."""
    c = Ch()
    target = c.queue()
    q = c.queue({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target,
                 "x-message-ttl": 0})
    c.publish(q, b"m")
    c.wait_count(target, 1, 2.0)
    d = c.get(target)
    eq((d["exchange"], d["routing_key"]), ("", target))
    check_death(xdeath(d)[0][0], 1, "expired", q, "", [q])
    q2 = c.queue({"x-dead-letter-exchange": uniq("missing"), "x-message-ttl": 0})
    c.publish(q2, b"m")
    eq(c.acked, {1, 2})
    time.sleep(0.3)
    eq(c.count(q2), 0)


@test
def per_message_ttl_expiry_dead_letters_with_original_expiration():
    """Expiry via expiration property: x-death has original-expiration, property removed."""
    c = Ch()
    x, q, dlx, dq = dlx_setup(c)
    c.publish("rk1", b"m", {"expiration": "200", "headers": {"h": 1}}, exchange=x)
    c.wait_count(dq, 1, 2.0)
    d = c.get(dq)
    assert "expiration" not in d["props"], "expiration kept: %r" % d["props"]
    entries, h = xdeath(d)
    eq(len(entries), 1)
    check_death(entries[0], 1, "expired", q, x, ["rk1"], expiration="200")
    check_first_death(h, "expired", q, x)
    eq(h.get("h"), ("I", 1))
    # queue TTL expiry has no original-expiration
    x2, q2, dlx2, dq2 = dlx_setup(c, qargs={"x-message-ttl": 100})
    c.publish("rk1", b"m", exchange=x2)
    c.wait_count(dq2, 1, 2.0)
    check_death(xdeath(c.get(dq2))[0][0], 1, "expired", q2, x2, ["rk1"])


@test
def x_death_count_increments_and_new_entries_go_first():
    """Same queue+reason again -> count 2 (entry moved first); other deaths add entries."""
    c = Ch()
    # q1: rejected messages come straight back to q1 (reject cycles are allowed)
    q1 = uniq("loop")
    c.declare(q1, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q1})
    c.publish(q1, b"m")
    for n in (1, 2):
        g = c.get(q1, no_ack=False)
        c.s.sendall(gen_basic_reject(1, g["delivery_tag"], requeue=False))
        wait_until(lambda: c.count(q1) == 1, 2.0, 0.05, "message back in q1")
    d = c.get(q1, no_ack=False)
    entries, h = xdeath(d)
    eq(len(entries), 1)
    check_death(entries[0], 2, "rejected", q1, "", [q1])
    check_first_death(h, "rejected", q1, "")
    # now expire it into q2 via q-ttl queue: publish the dead-lettered message
    # (with its headers) to a TTL queue whose DLX is q2
    q2 = c.queue()
    qt = c.queue({"x-message-ttl": 0, "x-dead-letter-exchange": "",
                  "x-dead-letter-routing-key": q2})
    # re-publish byte-identical properties (keeps the 'l' count type)
    c.s.sendall(gen_basic_publish(1, "", qt) + frame(FRAME_HEADER, 1, d["raw_header"])
                + gen_body(1, d["body"]))
    c.seq += 1
    c.wait_confirms()
    c.wait_count(q2, 1, 2.0)
    entries, h = xdeath(c.get(q2))
    eq(len(entries), 2)
    check_death(entries[0], 1, "expired", qt, "", [qt])
    check_death(entries[1], 2, "rejected", q1, "", [q1])
    check_first_death(h, "rejected", q1, "")


@test
def dead_letter_cycle_is_dropped():
    """Expiry dead-lettering back into a queue the message already died in is dropped."""
    c = Ch()
    fan = c.exchange("fanout")
    q = c.queue({"x-message-ttl": 100, "x-dead-letter-exchange": fan})
    other = c.queue()
    c.bind(q, fan)
    c.bind(other, fan)
    c.publish(q, b"m")
    c.wait_count(other, 1, 2.0)
    time.sleep(0.5)
    eq(c.count(q), 0, "cycle copy must be dropped")
    eq(c.count(other), 1)
    entries, h = xdeath(c.get(other))
    check_death(entries[0], 1, "expired", q, "", [q])


# ---------------------------------------------------------------- priority

@test
def priority_queue_orders_by_priority_fifo_within_and_caps_at_max():
    """x-max-priority=5: higher first, FIFO within a level, priority 9 counts as 5."""
    c = Ch()
    q = c.queue({"x-max-priority": 5})
    plan = [(b"a", 1), (b"b", 5), (b"c", 3), (b"d", None), (b"e", 9), (b"f", 5), (b"g", 0)]
    for body, p in plan:
        c.publish(q, body, {} if p is None else {"priority": p})
    got = []
    for _ in plan:
        g = c.get(q)
        got.append((g["body"], g["props"].get("priority")))
    eq(got, [(b"b", 5), (b"e", 9), (b"f", 5), (b"c", 3), (b"a", 1), (b"d", None),
             (b"g", 0)])


@test
def priority_queue_delivers_by_priority_to_consumer():
    """Messages waiting in a priority queue are delivered to a new consumer highest first."""
    c = Ch()
    q = c.queue({"x-max-priority": 10}, exclusive=False, auto_delete=True)
    for i, p in enumerate([0, 10, 5, 10, 0]):
        c.publish(q, b"%d" % i, {"priority": p})
    s = raw_connection()
    s.sendall(gen_basic_consume(1, q, "c", no_ack=True))
    expect_method(s, *BASIC_CONSUME_OK)
    eq([read_delivery(s)["body"] for _ in range(5)], [b"1", b"3", b"2", b"0", b"4"])


# ---------------------------------------------------------------- consumers

def consume(s, q, tag, no_ack=False, args=None, prefetch=None, channel=1):
    if prefetch is not None:
        s.sendall(gen_basic_qos(channel, prefetch))
        expect_method(s, *BASIC_QOS_OK)
    s.sendall(gen_basic_consume(channel, q, tag, no_ack=no_ack, arguments=args))
    expect_method(s, *BASIC_CONSUME_OK)


@test
def single_active_consumer_only_one_receives_and_next_takes_over():
    """x-single-active-consumer: one consumer gets all; cancel/close -> the next, in order."""
    c = Ch()
    q = c.declare(uniq("sac"), {"x-single-active-consumer": True}, exclusive=False)[0]
    try:
        a, b, d = raw_connection(), raw_connection(), raw_connection()
        consume(a, q, "A")
        consume(b, q, "B")
        consume(d, q, "D")
        for i in range(3):
            c.publish(q, b"m%d" % i)
        got = [read_delivery(a) for _ in range(3)]
        eq([g["body"] for g in got], [b"m0", b"m1", b"m2"])
        assert_no_frame(b, 0.3)
        assert_no_frame(d, 0.01)
        a.sendall(gen_basic_ack(1, got[0]["delivery_tag"]))
        # A cancels: its unacked m1, m2 stay with A's channel; new messages -> B
        a.sendall(gen_method(1, 60, 30, shortstr("A") + bits(False)))
        expect_method(a, *BASIC_CANCEL_OK)
        c.publish(q, b"m3")
        eq(read_delivery(b)["body"], b"m3")
        assert_no_frame(d, 0.3)
        # A's channel closes: m1, m2 are requeued and go to B before m4
        a.sendall(gen_channel_close(1))
        expect_method(a, *CHANNEL_CLOSE_OK)
        c.publish(q, b"m4")
        got = [read_delivery(b) for _ in range(3)]
        eq([(g["body"], g["redelivered"]) for g in got],
           [(b"m1", True), (b"m2", True), (b"m4", False)])
        assert_no_frame(d, 0.3)
        # B's connection goes away: D takes over; B's unacked messages are
        # requeued in their original queue order (m1 m2 before m3), then m5
        b.close()
        wait_until(lambda: declare_queue(c.s, 1, q, passive=True)[2] == 1, 5.0, 0.05,
                   "B's consumer to go away")
        c.publish(q, b"m5")
        got = [(g["body"], g["redelivered"]) for g in (read_delivery(d) for _ in range(5))]
        eq(got, [(b"m1", True), (b"m2", True), (b"m3", True), (b"m4", True),
                 (b"m5", False)])
    finally:
        c.s.sendall(gen_queue_delete(1, q))
        expect_method(c.s, *QUEUE_DELETE_OK)


@test
def single_active_consumer_with_false_is_ordinary_round_robin():
    """x-single-active-consumer=false: normal round-robin between consumers."""
    c = Ch()
    q = c.queue({"x-single-active-consumer": False}, exclusive=False, auto_delete=True)
    a, b = raw_connection(), raw_connection()
    consume(a, q, "A", no_ack=True)
    consume(b, q, "B", no_ack=True)
    for i in range(4):
        c.publish(q, b"m%d" % i)
    eq(sorted([read_delivery(a)["body"] for _ in range(2)]
              + [read_delivery(b)["body"] for _ in range(2)]),
       [b"m0", b"m1", b"m2", b"m3"])


@test
def lazy_queue_mode_is_accepted_and_works():
    """x-queue-mode=lazy (and default) accepted; messages flow normally."""
    c = Ch()
    for mode in ("lazy", "default"):
        q = c.queue({"x-queue-mode": mode})
        for i in range(3):
            c.publish(q, b"%d" % i)
        eq(c.bodies(q), [b"0", b"1", b"2"])


@test
def consumer_priorities_high_priority_gets_messages_while_it_has_credit():
    """x-priority on basic.consume: higher consumer served first, lower gets the overflow."""
    c = Ch()
    q = c.queue(exclusive=False, auto_delete=True)
    hi, lo = raw_connection(), raw_connection()
    consume(lo, q, "lo", prefetch=100)
    consume(hi, q, "hi", prefetch=2, args={"x-priority": 10})
    for i in range(6):
        c.publish(q, b"m%d" % i)
    h = [read_delivery(hi) for _ in range(2)]
    eq([g["body"] for g in h], [b"m0", b"m1"])
    eq([read_delivery(lo)["body"] for _ in range(4)], [b"m2", b"m3", b"m4", b"m5"])
    assert_no_frame(hi, 0.2)
    hi.sendall(gen_basic_ack(1, h[1]["delivery_tag"], multiple=True))
    for i in range(6, 9):
        c.publish(q, b"m%d" % i)
    eq([read_delivery(hi)["body"] for _ in range(2)], [b"m6", b"m7"])
    eq(read_delivery(lo)["body"], b"m8")
    # negative priorities are below the default 0
    q2 = c.queue(exclusive=False, auto_delete=True)
    n1, n2 = raw_connection(), raw_connection()
    consume(n1, q2, "neg", no_ack=True, args={"x-priority": -5})
    consume(n2, q2, "zero", no_ack=True)
    for i in range(3):
        c.publish(q2, b"%d" % i)
    eq([read_delivery(n2)["body"] for _ in range(3)], [b"0", b"1", b"2"])
    assert_no_frame(n1, 0.2)


@test
def consumer_priority_argument_must_be_integer():
    """x-priority of the wrong type -> 406 naming the queue."""
    for val, tname in (("high", "longstr"), (1.5, "double")):
        s = raw_connection()
        q = declare_queue(s)[0]
        s.sendall(gen_basic_consume(1, q, arguments={"x-priority": val}))
        eq(expect_close(s, connection=False),
           (PRECONDITION_FAILED,
            "PRECONDITION_FAILED - invalid arg 'x-priority' for queue '%s' in vhost '/': "
            "\"expected integer, got %s\"" % (q, tname), 60, 20))


# ---------------------------------------------------------------- exchanges

@test
def alternate_exchange_receives_unroutable_and_suppresses_return():
    """alternate-exchange: unroutable -> AE; mandatory + AE routes -> no basic.return."""
    c = Ch()
    ae = c.exchange("fanout")
    qa = c.queue()
    c.bind(qa, ae)
    e = c.exchange("direct", args={"alternate-exchange": ae})
    qe = c.queue()
    c.bind(qe, e, "k")
    c.publish("k", b"routed", exchange=e, mandatory=True)
    c.publish("other", b"alt", exchange=e, mandatory=True)
    eq(c.acked, {1, 2})
    eq(c.returns, [])
    eq(c.bodies(qe), [b"routed"])
    g = c.get(qa)
    eq((g["body"], g["exchange"], g["routing_key"]), (b"alt", e, "other"))
    eq(c.get(qa), None)


@test
def alternate_exchange_that_cannot_route_returns_mandatory():
    """AE with no bindings (or missing AE) + mandatory -> basic.return 312 NO_ROUTE."""
    c = Ch()
    ae = c.exchange("fanout")
    e = c.exchange("direct", args={"alternate-exchange": ae})
    c.publish("k", b"lost", exchange=e, mandatory=True)
    eq(c.returns, [(NO_ROUTE, "NO_ROUTE", e, "k", b"lost")])
    eq(c.acked, {1})
    e2 = c.exchange("direct", args={"alternate-exchange": uniq("missing-ae")})
    c.publish("k", b"lost2", exchange=e2, mandatory=True)
    eq(c.returns[1:], [(NO_ROUTE, "NO_ROUTE", e2, "k", b"lost2")])


@test
def internal_exchange_refuses_direct_publish_but_serves_as_ae():
    """Internal exchange: direct publish -> 403; as an alternate exchange it routes."""
    c = Ch()
    ae = c.exchange("fanout", internal=True)
    qa = c.queue()
    c.bind(qa, ae)
    e = c.exchange("direct", args={"alternate-exchange": ae})
    c.publish("x", b"via-ae", exchange=e)
    eq(c.bodies(qa), [b"via-ae"])
    c.s.sendall(gen_publish(1, ae, "", b"direct"))
    eq(expect_close(c.s, connection=False),
       (ACCESS_REFUSED, "ACCESS_REFUSED - cannot publish to internal exchange '%s' in "
        "vhost '/'" % ae, 60, 40))


@test
def alternate_exchange_argument_must_be_a_string():
    """alternate-exchange of the wrong type -> 406 with RabbitMQ's text."""
    s = raw_connection()
    name = uniq("x")
    s.sendall(gen_exchange_declare(1, name, "direct", arguments={"alternate-exchange": 5}))
    eq(expect_close(s, connection=False),
       (PRECONDITION_FAILED, "PRECONDITION_FAILED - invalid type 'signedint' for arg "
        "'alternate-exchange' in exchange '%s' in vhost '/'" % name, 40, 10))


# ---------------------------------------------------------------- invalid arguments

INVALID_ARGS = [
    ({"x-message-ttl": "abc"}, "x-message-ttl", '"expected integer, got longstr"'),
    ({"x-message-ttl": 1.5}, "x-message-ttl", '"expected integer, got double"'),
    ({"x-message-ttl": Decimal((0, 5))}, "x-message-ttl", '"expected integer, got decimal"'),
    ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
    ({"x-message-ttl": 2 ** 40}, "x-message-ttl", "{value_too_large,1099511627776}"),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-expires": -5}, "x-expires", "{value_negative,-5}"),
    ({"x-expires": "x"}, "x-expires", '"expected integer, got longstr"'),
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": "x"}, "x-max-length", '"expected integer, got longstr"'),
    ({"x-max-length": True}, "x-max-length", '"expected integer, got bool"'),
    ({"x-max-length-bytes": -1}, "x-max-length-bytes", "{value_negative,-1}"),
    ({"x-max-length-bytes": "x"}, "x-max-length-bytes", '"expected integer, got longstr"'),
    ({"x-overflow": "foo"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,signedint}"),
    ({"x-dead-letter-routing-key": "rk"}, "x-dead-letter-routing-key",
     "routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": "", "x-dead-letter-routing-key": 5},
     "x-dead-letter-routing-key", "{unacceptable_type,signedint}"),
    ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
    ({"x-max-priority": "x"}, "x-max-priority", '"expected integer, got longstr"'),
    ({"x-queue-mode": "foo"}, "x-queue-mode", "\"unsupported queue mode 'foo'\""),
    ({"x-queue-mode": 1}, "x-queue-mode", "{unacceptable_type,signedint}"),
    ({"x-single-active-consumer": "yes"}, "x-single-active-consumer",
     "{unacceptable_type,longstr}"),
    ({"x-single-active-consumer": 1}, "x-single-active-consumer",
     "{unacceptable_type,signedint}"),
    ({"x-queue-type": "foo"}, "x-queue-type", "\"unsupported queue type 'foo'\""),
]


@test
def invalid_queue_arguments_are_406_with_rabbitmq_text():
    """Each ill-typed/invalid queue argument -> channel 406 with RabbitMQ's exact text."""
    failures = []
    for args, key, reason in INVALID_ARGS:
        name, close = declare_error(args)
        want = (PRECONDITION_FAILED, "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' "
                "in vhost '/': %s" % (key, name, reason), 50, 10)
        if close != want:
            failures.append("%r: expected %r, got %r" % (args, want[1], close))
    # x-dead-letter-exchange of the wrong type has a different shape
    name, close = declare_error({"x-dead-letter-exchange": 1})
    want = (PRECONDITION_FAILED, "PRECONDITION_FAILED - invalid type 'signedint' for arg "
            "'x-dead-letter-exchange' in queue '%s' in vhost '/'" % name, 50, 10)
    if close != want:
        failures.append("x-dead-letter-exchange=1: expected %r, got %r" % (want[1], close))
    assert not failures, "\n  " + "\n  ".join(failures)


@test
def valid_edge_arguments_are_accepted():
    """Edge values RabbitMQ accepts: ttl 0 and 2^32, max-length 0, max-priority 0/255,
    reject-publish-dlx, a DLX that does not exist, x-queue-type classic."""
    c = Ch()
    for args in ({"x-message-ttl": 0}, {"x-message-ttl": 2 ** 32}, {"x-max-length": 0},
                 {"x-max-priority": 0}, {"x-max-priority": 255},
                 {"x-overflow": "reject-publish-dlx"}, {"x-overflow": "drop-head"},
                 {"x-dead-letter-exchange": uniq("nope")}, {"x-queue-type": "classic"},
                 {"x-expires": 1}, {"x-single-active-consumer": True},
                 {"x-unknown-thing": "whatever"}):
        c.queue(args)


@test
def dead_letter_loop_through_a_full_queue_stops_as_rabbitmq_does():
    """A message with a rejection in its past, rejected into an exchange that
    leads back to its own full reject-publish-dlx queue: the automatic
    maxlen death that would follow closes a cycle with no client in it, and
    the message is dropped there (rabbit_dead_letter:is_cycle looks at the
    deaths since the target's own, not at the whole history). It once looped
    in the broker until its stack overflowed."""
    import pika
    c = pika_connect()
    ch = c.channel()
    x, q, sink = uniq("loopx"), uniq("loopq"), uniq("sink")
    ch.exchange_declare(x, "fanout")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                   "x-dead-letter-exchange": x})
    ch.queue_declare(sink)
    ch.queue_bind(q, x)
    ch.queue_bind(sink, x)
    ch.basic_publish("", q, b"m1")
    m, _, _ = ch.basic_get(q)
    ch.basic_reject(m.delivery_tag, requeue=False)    # m1: to q again, and to sink

    def get_when_there(queue):
        deadline = time.time() + 5
        while time.time() < deadline:
            got = ch.basic_get(queue, auto_ack=False)
            if got[0] is not None:
                return got
            time.sleep(0.02)
        raise AssertionError("nothing in " + queue)
    m, _, _ = get_when_there(q)
    ch.basic_publish("", q, b"m2")                    # q is full again
    ch.basic_reject(m.delivery_tag, requeue=False)    # m1 again: q full -> maxlen -> cycle
    deaths = []
    deadline = time.time() + 5
    while len(deaths) < 3 and time.time() < deadline:
        g = ch.basic_get(sink, auto_ack=True)
        if g[0] is None:
            time.sleep(0.02)
            continue
        eq(g[2], b"m1", "body")
        deaths.append(tuple((e["queue"] == q, e["reason"], e["count"])
                            for e in g[1].headers["x-death"]))
    assert_no_more = ch.basic_get(sink, auto_ack=True)[0] is None
    eq(sorted(deaths), sorted([((True, "rejected", 1),), ((True, "rejected", 2),),
                               ((True, "maxlen", 1), (True, "rejected", 2))]), "deaths")
    assert assert_no_more, "more copies than RabbitMQ makes"
    eq(ch.queue_declare(q, passive=True).method.message_count, 1, "m2 in q")
    ch.queue_delete(q)
    ch.queue_delete(sink)
    ch.exchange_delete(x)
    c.close()


if __name__ == "__main__":
    run()
