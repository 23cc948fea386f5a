"""Goal: a client on ANY broker of a cluster can declare, publish to, consume
from, get from and ack on ANY queue, with the guarantees it has on the
queue's primary: definitions are committed to the map before declare-ok and
are then visible on every broker; a publish through a proxy is confirmed
only once the primary has it; a consumer on a proxy gets exactly its
prefetch, in order, with no loss and no duplicate; a consumer that dies on a
proxy has its unacked messages redelivered to another consumer at once;
basic.get works through a proxy; a broker without quorum refuses definition
changes with 541 while the majority goes on.

Method: three quayd processes on loopback (tests/cluster/clustertest.py),
driven with pika. Which broker is a queue's primary is read from
GET /api/queues (the map's placement); each test picks names so that the
primary, the publisher's broker and the consumer's broker differ. Faults
are injected with kill -9 and SIGSTOP/SIGCONT.
"""
import json
import os
import signal
import subprocess
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, closer, metric, quayd_path, run, test,  # noqa: E402
                         wait_until)
from quaytest import handshake  # noqa: E402

import pika  # noqa: E402

cluster = None
A = B = C = None


def connect(member, **kw):
    params = pika.ConnectionParameters("127.0.0.1", member.amqp_port, heartbeat=0,
                                       blocked_connection_timeout=30, **kw)
    return pika.BlockingConnection(params)


def pump(conn, seconds):
    """Processes the connection's events for that long (pika returns from
    process_data_events as soon as it dispatched something)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        conn.process_data_events(time_limit=left)


def api_queues(member):
    return member.api_get("/api/queues", timeout=5)


def primary_of(member, name):
    for q in api_queues(member):
        if q["name"] == name:
            return q["primary"]
    return None


def queue_on(primary, via, prefix, **declare):
    """Declares queues named prefix-N through broker via until one is placed
    on primary; deletes the others. Returns the name."""
    conn = connect(via)
    ch = conn.channel()
    tried = []
    try:
        for i in range(64):
            name = "%s-%d" % (prefix, i)
            ch.queue_declare(name, **declare)
            if primary_of(via, name) == primary.name:
                for other in tried:
                    ch.queue_delete(other)
                return name
            tried.append(name)
        raise AssertionError("no name placed on %s" % primary.name)
    finally:
        conn.close()


@test(timeout=120)
def three_brokers_and_their_links():
    global cluster, A, B, C
    cluster = Cluster()
    A = cluster.add("a")
    wait_until(lambda: len(cluster.leaders([A])) == 1, 15, what="a to lead")
    B = cluster.add("b", join=[A])
    C = cluster.add("c", join=[A, B])
    members = (A, B, C)
    expect = {"a": "up", "b": "up", "c": "up"}
    wait_until(lambda: all(m.view() and m.view().brokers == expect for m in members), 20,
               what="three brokers up everywhere")
    # Every broker links to the two others (one login each way per pair).
    wait_until(lambda: all(m.log_text().count("is up") >= 2 for m in members), 10,
               what="links up")


@test(timeout=60)
def declare_on_one_broker_is_visible_on_all():
    conn = connect(B)
    ch = conn.channel()
    t0 = time.monotonic()
    ch.exchange_declare("events", "topic", durable=True)
    ch.queue_declare("visible", durable=True)
    ch.queue_bind("visible", "events", "order.*")
    elapsed = time.monotonic() - t0
    print("# three definitions committed through follower b in %.1f ms" % (elapsed * 1000))
    conn.close()
    for m in (A, B, C):
        c = connect(m)
        x = c.channel()
        x.exchange_declare("events", "topic", durable=True, passive=True)
        ok = x.queue_declare("visible", passive=True)
        assert ok.method.queue == "visible"
        c.close()
    # An inequivalent redeclare anywhere gets RabbitMQ's 406.
    c = connect(C)
    x = c.channel()
    try:
        x.queue_declare("visible", durable=False)
        raise AssertionError("inequivalent redeclare accepted")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 406, e
    c.close()
    # Routing on any broker uses the map's bindings: publish on c, get on a.
    c = connect(C)
    x = c.channel()
    x.confirm_delivery()
    x.basic_publish("events", "order.created", b"hello", mandatory=True)
    c.close()
    c = connect(A)
    x = c.channel()
    wait_until(lambda: x.queue_declare("visible", passive=True).method.message_count == 1
               or primary_of(A, "visible") != "a", 5)
    m, _, body = x.basic_get("visible", auto_ack=True)
    assert body == b"hello", body
    assert m.routing_key == "order.created" and m.exchange == "events", m
    c.close()


@test(timeout=120)
def what_a_client_was_told_exists_every_broker_has_at_once():
    """A declare-ok through one broker means the queue is there through
    every broker, with no pause (RabbitMQ commits its metadata on every node
    first); likewise a delete-ok means it is gone everywhere. Checked
    back to back, as a client that passes a queue's name to another client
    on another broker would."""
    rounds = 150
    conns = {m.name: connect(m) for m in (A, B, C)}
    try:
        declarer = conns["b"].channel()
        publisher = conns["c"].channel()
        publisher.confirm_delivery()
        checker = conns["a"].channel()
        missing = 0
        for i in range(rounds):
            name = "told-%d" % i
            declarer.queue_declare(name)
            try:
                publisher.basic_publish("", name, b"x", mandatory=True)
            except pika.exceptions.UnroutableError:
                missing += 1
            checker.queue_declare(name, passive=True)  # 404 closes the test
            declarer.queue_delete(name)
            try:
                checker.queue_declare(name, passive=True)
                raise AssertionError("round %d: '%s' deleted through b, still on a" % (i, name))
            except pika.exceptions.ChannelClosedByBroker as e:
                assert e.reply_code == 404, e
                checker = conns["a"].channel()
        assert missing == 0, "%d of %d publishes right after declare-ok were unroutable" % (
            missing, rounds)
    finally:
        for c in conns.values():
            c.close()


@test(timeout=60)
def clients_learn_the_cluster():
    # connection.open-ok's known-hosts lists every broker's AMQP address.
    sock = socket.create_connection(("127.0.0.1", C.amqp_port), timeout=5)
    hosts = set(handshake(sock)["known_hosts"].split(","))
    sock.close()
    assert hosts == {"127.0.0.1:%d" % m.amqp_port for m in (A, B, C)}, hosts
    # amq.quay.cluster: bind to it anywhere, never publish to it.
    c = connect(C)
    ch = c.channel()
    events = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(events, "amq.quay.cluster", "queue.#")
    d = connect(A)
    d.channel().queue_declare("evt-q", durable=True)
    d.close()
    m = body = None
    for _ in range(50):
        m, props, body = ch.basic_get(events, auto_ack=True)
        if m is not None:
            break
        time.sleep(0.05)
    assert m is not None, "no event for a placed queue"
    assert m.routing_key == "queue.placed./.evt-q", m.routing_key
    assert props.content_type == "application/json", props
    ev = json.loads(body)
    assert ev["queue"] == "evt-q" and ev["primary"] in ("a", "b", "c"), ev
    assert sorted(b["name"] for b in ev["brokers"]) == ["a", "b", "c"], ev
    time.sleep(0.2)
    assert ch.basic_get(events)[0] is None, "an event delivered twice"
    try:
        ch.basic_publish("amq.quay.cluster", "queue.fake", b"{}")
        ch.queue_declare(events, passive=True)  # the close arrives by now
        raise AssertionError("a client published to amq.quay.cluster")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 403, e
    c.close()


@test(timeout=120)
def publish_on_b_to_a_consume_on_c():
    name = queue_on(A, B, "pbc", durable=True)
    total = 5000
    pub = connect(B)
    pch = pub.channel()
    pch.confirm_delivery()
    t0 = time.monotonic()
    for i in range(total):
        pch.basic_publish("", name, b"%d" % i,
                          pika.BasicProperties(delivery_mode=2 if i % 2 else 1))
    print("# %d confirmed publishes via proxy b in %.2f s" % (total, time.monotonic() - t0))
    pub.close()
    con = connect(C)
    cch = con.channel()
    cch.basic_qos(prefetch_count=50)
    got = []

    def on_message(ch, method, props, body):
        got.append(int(body))
        ch.basic_ack(method.delivery_tag)
        if len(got) == total:
            ch.stop_consuming()

    cch.basic_consume(name, on_message)
    deadline = time.monotonic() + 60
    while len(got) < total and time.monotonic() < deadline:
        con.process_data_events(time_limit=0.5)
    con.close()
    assert got == list(range(total)), "lost, duplicated or out of order: %d got" % len(got)
    c = connect(A)
    assert c.channel().queue_declare(name, passive=True).method.message_count == 0
    c.close()


@test(timeout=60)
def prefetch_holds_end_to_end():
    name = queue_on(A, C, "pf")
    pub = connect(A)
    pch = pub.channel()
    for i in range(100):
        pch.basic_publish("", name, b"%d" % i)
    pub.close()
    con = connect(B)
    ch = con.channel()
    ch.basic_qos(prefetch_count=7)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m.delivery_tag))
    pump(con, 1.0)
    assert len(got) == 7, "prefetch 7 through a proxy delivered %d" % len(got)
    # The proxy holds nothing nobody asked for: the primary still has 93
    # ready, and a passive declare through any broker says so.
    for m in (A, B, C):
        c = connect(m)
        ok = c.channel().queue_declare(name, passive=True).method
        c.close()
        assert (ok.message_count, ok.consumer_count) == (93, 1), (m.name, ok)
    ch.basic_ack(got[-1], multiple=True)
    pump(con, 1.0)
    assert len(got) == 14, len(got)
    con.close()


@test(timeout=60)
def a_dead_consumer_on_a_proxy_gives_its_messages_back_at_once():
    name = queue_on(A, B, "dead")
    pub = connect(B)
    pch = pub.channel()
    pch.confirm_delivery()
    for i in range(20):
        pch.basic_publish("", name, b"%d" % i)
    pub.close()
    # A consumer on c takes 10 and dies without acking (its socket is cut).
    victim = connect(C)
    vch = victim.channel()
    vch.basic_qos(prefetch_count=10)
    held = []
    vch.basic_consume(name, lambda c, m, p, b: held.append(int(b)))
    pump(victim, 1.0)
    assert len(held) == 10, held
    victim._impl._transport._sock.close()  # no close handshake: a dying client
    t0 = time.monotonic()
    other = connect(B)
    och = other.channel()
    got = []

    def on_message(ch, m, p, b):
        got.append((int(b), m.redelivered))
        ch.basic_ack(m.delivery_tag)

    och.basic_consume(name, on_message)
    deadline = time.monotonic() + 10
    while len(got) < 20 and time.monotonic() < deadline:
        other.process_data_events(time_limit=0.2)
    print("# all 20 delivered to the second consumer %.2f s after the first died"
          % (time.monotonic() - t0))
    other.close()
    assert sorted(b for b, _ in got) == list(range(20)), got
    assert all(r for b, r in got if b in held), "held ones must come back redelivered"


@test(timeout=60)
def basic_get_through_a_proxy():
    name = queue_on(A, A, "get")
    c = connect(A)
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, b"g%d" % i)
    c.close()
    c = connect(C)
    ch = c.channel()
    m, props, body = ch.basic_get(name, auto_ack=False)
    assert body == b"g0" and m.message_count == 2, (body, m)
    ch.basic_reject(m.delivery_tag, requeue=True)  # back to the primary at once
    m, props, body = ch.basic_get(name, auto_ack=False)
    assert body == b"g0" and m.redelivered, (body, m)
    ch.basic_ack(m.delivery_tag)
    m, props, body = ch.basic_get(name, auto_ack=True)
    assert body == b"g1", body
    m, props, body = ch.basic_get(name, auto_ack=True)
    assert body == b"g2", body
    assert ch.basic_get(name)[0] is None
    c.close()


def link_channels(member):
    """quay_cluster_link_channels from member's /metrics: the channels the
    other brokers' links have open there."""
    return metric(member, "quay_cluster_link_channels")


@test(timeout=240)
def thousands_of_remote_consumers_and_polled_queues():
    """A proxy holds a channel at the primary per remote consumer: more
    than a client's channel_max (2,047) of them, over one link, all get
    their consume-ok and their message. Queues a client only polled
    (passive declares) do not keep a channel each at the primary: an idle
    getter closes."""
    n = 2100
    ca = connect(A)  # auto-delete queues stay on their connection's broker
    cha = ca.channel()
    names = ["many-%d" % i for i in range(n)]
    polled = ["polled-%d" % i for i in range(300)]
    for name in names + polled:
        cha.queue_declare(name, auto_delete=True)
    for name in names:
        cha.basic_publish("", name, name.encode())
    assert primary_of(C, names[-1]) == "a"
    # (Other tests' getters and consumers: a few at most, closing.)
    wait_until(lambda: link_channels(A) < 30, 20, what="few link channels at a")
    cc = connect(C)
    chc = cc.channel()
    got = set()
    for name in names:
        chc.basic_consume(name, lambda ch, m, p, body: got.add(body), auto_ack=True)
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        cc.process_data_events(time_limit=1)
    assert got == set(x.encode() for x in names), len(got)
    assert link_channels(A) >= n
    cc.close()  # (their queues go: auto-delete)
    wait_until(lambda: link_channels(A) < 30, 20, what="the consumers' channels closed")
    # Polled through B: a getter each, closed once idle.
    cb = connect(B)
    chb = cb.channel()
    for name in polled:
        assert chb.queue_declare(name, passive=True).method.message_count == 0
    assert link_channels(A) >= len(polled)
    wait_until(lambda: link_channels(A) < 30, 20, what="idle getters closed")
    assert chb.queue_declare(polled[0], passive=True).method.message_count == 0  # reopens
    cb.close()
    for name in polled:  # (never consumed: auto-delete does not take them)
        cha.queue_delete(name)
    ca.close()
    wait_until(lambda: not [q for q in api_queues(C) if q["name"].startswith(("many-", "polled-"))],
               20, what="the queues gone")


def links_of(member):
    return {link["name"]: link
            for link in member.api_get("/api/cluster/links", timeout=5)["links"]}


def death(props):
    """(reason, queue) of the newest x-death entry."""
    d = (props.headers or {}).get("x-death")
    assert d, props.headers
    return d[0]["reason"], d[0]["queue"]


@test(timeout=90)
def dead_letters_cross_to_a_queue_on_another_broker():
    """A queue on a dead-letters into a queue on c, for each reason (a reject
    through a proxy, a per-message TTL, x-overflow=reject-publish-dlx), with
    the client on b: the message arrives with its x-death as on one broker,
    and a broker never asserts (it once did: 'assertion failed:
    !queue->remote_ops')."""
    dlx = "dlx-cross"
    c = connect(B)
    ch = c.channel()
    ch.exchange_declare(dlx, "fanout")
    c.close()
    target = queue_on(C, B, "dl-target")
    c = connect(B)
    ch = c.channel()
    ch.queue_bind(target, dlx)
    c.close()
    args = {"x-dead-letter-exchange": dlx}
    rejecting = queue_on(A, B, "dl-reject", arguments=args)
    expiring = queue_on(A, B, "dl-expire", arguments=args)
    full = queue_on(A, B, "dl-full", arguments=dict(args, **{
        "x-max-length": 1, "x-overflow": "reject-publish-dlx"}))
    c = connect(B)
    ch = c.channel()
    ch.confirm_delivery()
    ch.basic_publish("", rejecting, b"rejected")
    m, _, _ = ch.basic_get(rejecting, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    ch.basic_publish("", expiring, b"expired", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", full, b"kept")
    try:
        ch.basic_publish("", full, b"over")
        raise AssertionError("a publish over x-max-length was confirmed")
    except pika.exceptions.NackError:
        pass
    got = {}
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        m, props, body = ch.basic_get(target, auto_ack=True)
        if m is None:
            time.sleep(0.05)
            continue
        got[body] = death(props)
    assert got == {b"rejected": ("rejected", rejecting), b"expired": ("expired", expiring),
                   b"over": ("maxlen", full)}, got
    for q in (rejecting, expiring, full, target):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)
    c.close()
    for m in (A, B, C):
        assert m.alive(), "%s died" % m.name


@test(timeout=90)
def fanout_to_queues_of_one_broker_crosses_the_link_once():
    """A message routed to ten queues whose primary is one other broker
    crosses the link to it once, not ten times (link bytes per 1 KiB
    message under 1.2 KiB), and every queue gets it."""
    names = [queue_on(A, B, "fan-%d" % i) for i in range(10)]
    c = connect(B)
    ch = c.channel()
    ch.exchange_declare("fan", "fanout")
    for q in names:
        ch.queue_bind(q, "fan")
    ch.confirm_delivery()
    n, body = 200, b"f" * 1024
    before = links_of(B)["a"]["bytes_out"]
    for _ in range(n):
        ch.basic_publish("fan", "", body)
    per = (links_of(B)["a"]["bytes_out"] - before) / n
    print("# link bytes per 1 KiB message fanned out to 10 queues on one broker: %.0f" % per)
    assert per <= 1.2 * 1024, per
    for q in names:
        eq_count = ch.queue_declare(q, passive=True).method.message_count
        assert eq_count == n, (q, eq_count)
        ch.queue_delete(q)
    ch.exchange_delete("fan")
    c.close()


@test(timeout=60)
def purge_and_conditional_delete_through_a_proxy():
    name = queue_on(A, B, "purge")
    c = connect(A)
    ch = c.channel()
    for i in range(5):
        ch.basic_publish("", name, b"x")
    c.close()
    c = connect(C)
    ch = c.channel()
    try:
        ch.queue_delete(name, if_empty=True)
        raise AssertionError("if_empty delete of a non-empty queue accepted")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 406 and "not empty" in e.reply_text, e
    ch = c.channel()
    assert ch.queue_purge(name).method.message_count == 5
    assert ch.queue_delete(name, if_empty=True).method.message_count == 0
    c.close()
    wait_until(lambda: all(primary_of(m, name) is None for m in (A, B, C)), 5,
               what="the queue gone everywhere")


@test(timeout=60)
def a_transaction_through_a_proxy_commits_once_the_primary_has_it():
    name = queue_on(A, B, "txq", durable=True)
    c = connect(C)
    ch = c.channel()
    ch.tx_select()
    for i in range(50):
        ch.basic_publish("", name, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    d = connect(A)
    assert d.channel().queue_declare(name, passive=True).method.message_count == 0
    ch.tx_commit()  # commit-ok only once the primary (and its backup) took them all
    assert d.channel().queue_declare(name, passive=True).method.message_count == 50
    d.close()
    ch.basic_publish("", name, b"rolled back")
    ch.tx_rollback()
    c.close()


@test(timeout=60)
def exclusive_queues_stay_with_their_connection():
    owner = connect(B)
    och = owner.channel()
    name = och.queue_declare("", exclusive=True).method.queue
    assert primary_of(B, name) == "b"
    other = connect(C)
    xch = other.channel()
    try:
        xch.queue_declare(name, passive=True)
        xch.basic_consume(name, lambda *a: None)
        raise AssertionError("another connection consumed an exclusive queue")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 405, e
    other.close()
    owner.close()
    # The owner is gone: the queue goes from the map, and from every broker.
    wait_until(lambda: all(primary_of(m, name) is None for m in (A, B, C)), 10,
               what="the exclusive queue to be deleted everywhere")


@test(timeout=60)
def exclusive_consumers_and_priorities_across_brokers():
    name = queue_on(A, A, "xc")
    first = connect(B)
    fch = first.channel()
    fch.basic_consume(name, lambda *a: None, exclusive=True)
    second = connect(C)
    sch = second.channel()
    try:
        sch.basic_consume(name, lambda *a: None)
        raise AssertionError("a second consumer got into an exclusively consumed queue")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 403 and "exclusive use" in e.reply_text, e
    second.close()
    first.close()
    # Consumer priorities are the primary's: the high-priority consumer on
    # c gets everything while it has credit, the low one on b nothing.
    low, high = connect(B), connect(C)
    got_low, got_high = [], []
    lch, hch = low.channel(), high.channel()
    lch.basic_consume(name, lambda c, m, p, b: got_low.append(b), auto_ack=True,
                      arguments={"x-priority": 1})
    hch.basic_consume(name, lambda c, m, p, b: got_high.append(b), auto_ack=True,
                      arguments={"x-priority": 10})
    pub = connect(A)
    pch = pub.channel()
    pch.confirm_delivery()
    for i in range(50):
        pch.basic_publish("", name, b"%d" % i)
    pub.close()
    for _ in range(20):
        pump(low, 0.05)
        pump(high, 0.05)
    assert len(got_high) == 50 and not got_low, (len(got_high), len(got_low))
    low.close()
    high.close()


@test(timeout=60)
def deleting_a_queue_cancels_consumers_on_other_brokers():
    name = queue_on(A, A, "del")
    con = connect(C)
    ch = con.channel()
    cancelled = []
    ch.basic_consume(name, lambda *a: None)
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    pump(con, 0.3)
    d = connect(B)
    d.channel().queue_delete(name)
    d.close()
    deadline = time.monotonic() + 5
    while not cancelled and time.monotonic() < deadline:
        con.process_data_events(time_limit=0.2)
    assert cancelled, "no basic.cancel reached the consumer on c"
    con.close()


@test(timeout=120)
def a_minority_refuses_definition_changes():
    # Stop two of three brokers (a minority of one is left), in the order
    # that keeps the leader among the stopped ones half of the time.
    survivor = C
    stopped = [A, B]
    for m in stopped:
        m.proc.send_signal(signal.SIGSTOP)
    try:
        c = connect(survivor)
        ch = c.channel()
        t0 = time.monotonic()
        try:
            ch.queue_declare("minority-q")
            raise AssertionError("a minority committed a declare")
        except (pika.exceptions.ConnectionClosedByBroker,
                pika.exceptions.StreamLostError) as e:
            code = getattr(e, "reply_code", None)
            assert code == 541, e
        print("# minority refused a declare after %.1f s" % (time.monotonic() - t0))
    finally:
        for m in stopped:
            m.proc.send_signal(signal.SIGCONT)
    # The cluster goes on once they are back.
    wait_until(lambda: len(cluster.leaders([A, B, C])) == 1, 15, what="a leader again")
    c = connect(survivor)
    c.channel().queue_declare("after-minority")
    c.close()


@test(timeout=120)
def a_killed_primary_makes_its_queues_unavailable_until_it_returns():
    # Without a backup (x-quay-backups 0) nobody can take over.
    name = queue_on(A, B, "lost", durable=True, arguments={"x-quay-backups": 0})
    c = connect(B)
    ch = c.channel()
    ch.confirm_delivery()
    ch.basic_publish("", name, b"kept", pika.BasicProperties(delivery_mode=2))
    c.close()
    con = connect(C)
    cch = con.channel()
    watch = cch.queue_declare("", exclusive=True).method.queue
    cch.queue_bind(watch, "amq.quay.cluster", "broker.#")
    cancelled = []
    cch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    cch.basic_qos(prefetch_count=1)
    cch.basic_consume(name, lambda c_, m, p, b: None)
    pump(con, 0.5)
    A.kill()
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        con.process_data_events(time_limit=0.2)
    assert cancelled, "the consumer on c was not told its queue is unavailable"
    keys = []
    while True:
        m, props, body = cch.basic_get(watch, auto_ack=True)
        if m is None:
            break
        keys.append(m.routing_key)
        states = {b["name"]: b["state"] for b in json.loads(body)["brokers"]}
    assert "broker.down.a" in keys and states["a"] == "down", (keys, states)
    con.close()
    # A publish to it through b is nacked, never silently dropped.
    c = connect(B)
    ch = c.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("", name, b"refused", mandatory=False)
        raise AssertionError("a publish to an unavailable queue was confirmed")
    except pika.exceptions.NackError:
        pass
    # A mandatory one comes back instead.
    try:
        ch.basic_publish("", name, b"returned", mandatory=True)
        raise AssertionError("a mandatory publish to an unavailable queue was not returned")
    except pika.exceptions.UnroutableError:
        pass
    c.close()
    A.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get("a") == "up" for m in (A, B, C)),
               20, what="a back up")

    def got_kept():
        c = connect(C)
        try:
            m, _, body = c.channel().basic_get(name, auto_ack=True)
            return body == b"kept"
        except pika.exceptions.ChannelClosedByBroker:
            return False
        finally:
            if c.is_open:
                c.close()
    wait_until(got_kept, 15, what="the durable message back through a proxy")


@test(timeout=120)
def a_killed_leader_is_replaced_and_definitions_stay():
    members = [A, B, C]
    leader = cluster.leaders(members)[0]
    others = [m for m in members if m is not leader]
    t0 = leader.kill()
    wait_until(lambda: len(cluster.leaders(others)) == 1, 10, what="a new leader")
    elapsed = time.monotonic() - t0
    print("# new leader %.2f s after kill -9 of the old one" % elapsed)
    wait_until(lambda: all(m.view() and m.view().brokers.get(leader.name) == "down"
                           for m in others), 10, what="the old leader marked down")
    # The map lost nothing: what was declared is there, and changes go on.
    for m in others:
        c = connect(m)
        ch = c.channel()
        ch.exchange_declare("events", "topic", durable=True, passive=True)
        # (its primary may be the dead broker: then it is unavailable, not gone)
        assert primary_of(m, "visible") is not None, m.name
        ch.queue_declare("after-leader-" + m.name, durable=True)
        c.close()
    leader.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(leader.name) == "up"
                           for m in members), 20, what="the old leader back")
    c = connect(leader)
    for m in others:
        c.channel().queue_declare("after-leader-" + m.name, passive=True)
    c.close()


@test(timeout=120)
def a_broker_joins_and_leaves():
    members = [A, B, C]
    D = cluster.add("d", join=[A, B])
    wait_until(lambda: all(m.view() and m.view().brokers.get("d") == "up"
                           for m in members + [D]), 20, what="d up everywhere")
    link_up = "(127.0.0.1:%d) is up" % D.amqp_port
    wait_until(lambda: all(link_up in m.log_text() for m in members), 10,
               what="every broker's link to d")
    name = queue_on(D, A, "dq")
    # d's own map has the queue already (a declare-ok waits for every
    # broker): d refuses at once.
    def post():
        return D.api_call("POST", "/api/cluster/leave", timeout=5)
    # 503 until d has applied the map as of its start ("try again"): a
    # broker that just joined may not have yet.
    deadline = time.monotonic() + 10
    status, body = post()
    while status == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
        status, body = post()
    assert status == 409 and body["queues"] == 1, (status, body)
    c = connect(B)
    c.channel().queue_delete(name)
    c.close()
    wait_until(lambda: primary_of(D, name) is None, 5)
    ctl = os.path.join(os.path.dirname(quayd_path()), "quayctl")
    out = subprocess.run([ctl, "--http", "127.0.0.1:%d" % D.http_port, "leave"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: all(m.view() and "d" not in m.view().brokers for m in members), 15,
               what="d gone from every map")
    assert D.stop() == 0
    # The cluster goes on without it (a queue on its old share of the ring works).
    c = connect(C)
    ch = c.channel()
    ch.queue_declare("after-d", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "after-d", b"x")
    assert ch.basic_get("after-d", auto_ack=True)[2] == b"x"
    c.close()


if __name__ == "__main__":
    run(closer(lambda: cluster))
