"""Goal: RabbitMQ's message_stats with rates ("X_details": {"rate": R},
messages per second over the last 5 s) in the management API: per queue
(publish, deliver, deliver_no_ack, get, get_no_ack, deliver_get,
redeliver, ack; messages_details and its ready/unacknowledged siblings),
in /api/overview, and per channel in /api/channels; rabbitmqadmin lists
the rate columns.

Method: a quayd with --http (in cluster mode a 3-broker cluster, the
client talking to b, which places its queues on another broker: the API
of b shows its stand-in's local counts, the primary's API the queue's own,
api_queues.h). pika publishes N messages at a steady pace for a few
seconds; the totals must be exact and each rate within a wide band of the
real pace (0.3x-3x: the rate is sampled once a second over 5 s, so the
band absorbs the lag without timing flakiness). A consumer acks them all:
deliver, ack and deliver_get totals follow. An idle queue reads 0.0, and
a queue's rates fall back to 0.0 once traffic stops.
"""
import glob
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F403

import pika  # noqa: E402

RMQ_HOME = (sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-3.*")) or [""])[-1]
ADMIN = (glob.glob(RMQ_HOME + "/plugins/rabbitmq_management-*/priv/www/cli/rabbitmqadmin")
         or [""])[0]

N = 100
PACE = 20.0          # messages per second: N takes 5 s
LOW, HIGH = 0.3 * PACE, 3.0 * PACE


def b():
    return broker()


def amqp():
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", b().port, heartbeat=0, blocked_connection_timeout=30))


def queue_json(name, member=None):
    port = member.http_port if member is not None else b().http_port
    return api_get("127.0.0.1", port, "/api/queues/%2F/" + name)


def rate(obj, key):
    return obj[key + "_details"]["rate"]


def in_band(value, what):
    assert LOW <= value <= HIGH, "%s: %r not within [%r, %r]" % (what, value, LOW, HIGH)


def publish_steadily(ch, name, n=N, pace=PACE):
    t0 = time.time()
    for i in range(n):
        ch.basic_publish("", name, b"m%d" % i)
        delay = t0 + (i + 1) / pace - time.time()
        if delay > 0:
            time.sleep(delay)


def views(name):
    """The API views of the queue whose totals count everything: b's (a
    single broker; in a cluster, the stand-in through which all the
    traffic went) and the primary's."""
    out = [("b", None)]
    if b().cluster is not None:
        p = b().primary_of(name)
        assert p is not None and p.name != "b", "the queue's primary is elsewhere"
        out.append((p.name, p))
    return out


@test(timeout=90)
def publish_deliver_ack_totals_and_rates():
    name = "rates-q"
    conn = amqp()
    ch = conn.channel()
    ch.queue_declare(name)
    seen_channel = {}

    def watch_channels():
        time.sleep(N / PACE - 1.0)   # near the end of the publishing
        seen_channel["list"] = b().api_get("/api/channels")
        seen_channel["connections"] = b().api_get("/api/connections")

    w = threading.Thread(target=watch_channels)
    w.start()
    publish_steadily(ch, name)
    w.join()
    for who, member in views(name):
        q = wait_until(lambda: (lambda q: q if q["message_stats"]["publish"] == N else None)(
            queue_json(name, member)), 10, what="publish == N on %s" % who)
        eq(q["messages"], N, "messages on %s" % who) if member is not None or \
            b().cluster is None else None
        ms = q["message_stats"]
        in_band(rate(ms, "publish"), "publish rate on %s" % who)
        eq(ms["deliver_get"], 0, "nothing delivered yet (%s)" % who)
        eq(rate(ms, "ack"), 0.0, "ack rate before any consumer (%s)" % who)
        for k in ("deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver"):
            eq(ms[k], 0, k + " on " + who)
            assert k + "_details" in ms, k + "_details on " + who
        if member is not None or b().cluster is None:   # counts of the queue itself
            in_band(rate(q, "messages"), "messages_details.rate on %s" % who)
            in_band(rate(q, "messages_ready"), "messages_ready_details.rate on %s" % who)
            eq(rate(q, "messages_unacknowledged"), 0.0, "unacked rate on %s" % who)
        eq(q["message_stats_from"], "primary" if member is not None or b().cluster is None
           else "local", "message_stats_from on " + who)
        if member is not None or b().cluster is None:   # where the messages are
            port = member.http_port if member is not None else b().http_port
            totals = api_get("127.0.0.1", port, "/api/overview")["queue_totals"]
            in_band(rate(totals, "messages"), "queue_totals.messages_details on %s" % who)
            in_band(rate(totals, "messages_ready"), "queue_totals ready rate on %s" % who)
    # The publishing channel, as /api/channels showed it near the end.
    mine = [c for c in seen_channel["list"] if c["message_stats"]["publish"] > 0]
    eq(len(mine), 1, "one publishing channel in %r" % seen_channel["list"])
    in_band(rate(mine[0]["message_stats"], "publish"), "the channel's publish rate")
    assert isinstance(rate(mine[0]["message_stats"], "ack"), float), mine[0]
    # Its connection's bytes: every publish is over 40 bytes of frames.
    conns = [c for c in seen_channel["connections"] if c["recv_oct"] > 40 * N / 2]
    eq(len(conns), 1, "one connection that received the publishes: %r"
       % seen_channel["connections"])
    assert rate(conns[0], "recv_oct") > 40 * PACE * 0.3, conns[0]
    assert conns[0]["send_oct"] > 0 and "send_oct_details" in conns[0], conns[0]
    ov = b().api_get("/api/overview")
    eq(ov["message_stats"]["publish"], N, "overview publish total")
    in_band(rate(ov["message_stats"], "publish"), "overview publish rate")
    eq(ov["rates_mode"], "basic", "rates_mode")

    # A consumer acks every message, steadily too (prefetch 1).
    ch.basic_qos(prefetch_count=1)
    got = []

    def on_message(c, method, props, body):
        got.append(body)
        time.sleep(1.0 / PACE)
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(name, on_message)
    deadline = time.time() + 30
    while len(got) < N and time.time() < deadline:
        conn.process_data_events(time_limit=0.2)
    eq(len(got), N, "consumed")
    conn.process_data_events(time_limit=0.2)
    for who, member in views(name):
        q = wait_until(lambda: (lambda q: q if q["message_stats"]["ack"] == N else None)(
            queue_json(name, member)), 10, what="ack == N on %s" % who)
        ms = q["message_stats"]
        eq((ms["publish"], ms["deliver"], ms["deliver_get"], ms["deliver_no_ack"], ms["get"]),
           (N, N, N, 0, 0), "totals on %s" % who)
        in_band(rate(ms, "deliver"), "deliver rate on %s" % who)
        in_band(rate(ms, "deliver_get"), "deliver_get rate on %s" % who)
        in_band(rate(ms, "ack"), "ack rate on %s" % who)
        if member is not None or b().cluster is None:
            eq(q["messages"], 0, "messages after the acks (%s)" % who)
            assert rate(q, "messages") < 0, "messages fall: %r" % rate(q, "messages")
    ov = b().api_get("/api/overview")["message_stats"]
    eq((ov["deliver"], ov["ack"], ov["deliver_get"]), (N, N, N), "overview totals")
    in_band(rate(ov, "ack"), "overview ack rate")
    conn.close()
    # Traffic stopped: within a window (and a sample) every rate is 0.0.
    for who, member in views(name):
        wait_until(lambda: all(rate(queue_json(name, member)["message_stats"], k) == 0.0
                               for k in ("publish", "deliver", "ack", "deliver_get")),
                   10, interval=0.5, what="the rates of %s fall to 0.0" % who)
    wait_until(lambda: rate(b().api_get("/api/overview")["message_stats"], "ack") == 0.0,
               10, interval=0.5, what="the overview's ack rate falls to 0.0")


@test
def get_and_no_ack_counters():
    name = "rates-get"
    conn = amqp()
    ch = conn.channel()
    ch.queue_declare(name)
    for i in range(4):
        ch.basic_publish("", name, b"g%d" % i)
    wait_until(lambda: queue_json(name)["message_stats"]["publish"] == 4, 10, what="published")
    wait_until(lambda: ch.queue_declare(name, passive=True).method.message_count == 4, 10,
               what="enqueued at the primary")
    m, _, _ = ch.basic_get(name, auto_ack=True)
    assert m is not None
    m, _, _ = ch.basic_get(name, auto_ack=False)
    assert m is not None
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _, _ = ch.basic_get(name, auto_ack=False)
    assert m is not None and m.redelivered, "the requeued message comes back redelivered"
    ch.basic_ack(m.delivery_tag)
    ch.basic_consume(name, lambda c, mm, p, body: None, auto_ack=True)
    conn.process_data_events(time_limit=0.5)
    for who, member in views(name):
        last = {}

        def counted():
            last["ms"] = queue_json(name, member)["message_stats"]
            return last["ms"] if last["ms"]["deliver_get"] == 5 else None
        ms = wait_until(counted, 10, what="counts on %s (%r)" % (who, last))
        got = (ms["get_no_ack"], ms["get"], ms["redeliver"], ms["ack"], ms["deliver_no_ack"],
               ms["deliver"], ms["deliver_get"])
        if member is None:
            eq(got, (1, 2, 1, 1, 2, 0, 5), "get/no-ack counters on %s" % who)
        else:
            # A stand-in's uplinks get and consume in ack mode (and ack for
            # a no-ack client): the primary counts them so (api_queues.h).
            eq(got, (0, 3, 1, 4, 0, 2, 5), "get/no-ack counters on the primary %s" % who)
    conn.close()


@test
def idle_queue_reads_zero():
    name = "rates-idle"
    conn = amqp()
    conn.channel().queue_declare(name)
    conn.close()
    time.sleep(2.5)   # sampled at least twice
    q = queue_json(name)
    for k, v in q["message_stats"].items():
        if k.endswith("_details"):
            eq(v, {"rate": 0.0}, k)
        else:
            eq(v, 0, k)
    for k in ("messages", "messages_ready", "messages_unacknowledged"):
        eq(rate(q, k), 0.0, k + "_details")
    listed = [x for x in b().api_get("/api/queues") if x["name"] == name]
    eq(len(listed), 1, "listed")
    eq(listed[0]["message_stats"], q["message_stats"], "the list shows the same stats")
    # Rates are JSON floats in a list too (it is written back from a parse).
    for k, v in listed[0]["message_stats"].items():
        if k.endswith("_details"):
            assert isinstance(v["rate"], float), "%s in the list: %r" % (k, v)


@test(timeout=90)
def burst_into_a_queue_idle_among_many():
    """300 idle queues, which the broker's tick no longer samples (rates.h:
    only queues whose values moved are), and a burst of 100 into one of
    them after it stood still: its first window reads the burst over the
    5 s window (20/s), neither 0.0 (its window started over) nor a spike
    (the burst per second); the overview's totals keep counting the idle
    queues' messages exactly."""
    conn = amqp()
    ch = conn.channel()
    names = ["rates-many-%d" % i for i in range(300)]
    for i, name in enumerate(names):
        ch.queue_declare(name)
        if i % 30 == 0:
            ch.basic_publish("", name, b"idle")
    name = names[1]
    time.sleep(3.0)   # sampled once, then still: off the active lists
    for i in range(100):
        ch.basic_publish("", name, b"b%d" % i)
    for who, member in views(name):
        q = wait_until(lambda: (lambda q: q if rate(q["message_stats"], "publish") > 0 else None)(
            queue_json(name, member)), 10, interval=0.2, what="a publish rate on %s" % who)
        eq(q["message_stats"]["publish"], 100, "publish total on %s" % who)
        in_band(rate(q["message_stats"], "publish"), "the burst's publish rate on %s" % who)
        if member is not None or b().cluster is None:
            in_band(rate(q, "messages_ready"), "the burst's ready rate on %s" % who)
    idle = queue_json(names[2])
    eq(rate(idle["message_stats"], "publish"), 0.0, "an idle queue's publish rate")
    if b().cluster is None:
        def totals_match():
            ov = b().api_get("/api/overview")["queue_totals"]
            listed = sum(x["messages"] for x in b().api_get("/api/queues"))
            return ov if ov["messages"] == listed and listed >= 110 else None
        wait_until(totals_match, 10, what="queue_totals.messages == the queues' sum")
        # (summed at the end of a round, up to 750 ms after the queue's part)
        def totals_moved():
            ov = totals_match()
            return ov if ov is not None and rate(ov, "messages") > 3.0 else None
        ov = wait_until(totals_moved, 5, interval=0.2, what="a queue_totals.messages rate")
        in_band(rate(ov, "messages"), "queue_totals.messages_details after the burst")
    for name in names:
        ch.queue_delete(name)
    conn.close()


@test(timeout=60)
def rabbitmqadmin_lists_rate_columns():
    assert ADMIN, "rabbitmqadmin not found under /usr/lib/rabbitmq"
    name = "rates-admin"
    conn = amqp()
    ch = conn.channel()
    ch.queue_declare(name)
    publish_steadily(ch, name, n=40, pace=PACE)
    cmd = ["/usr/bin/python3", ADMIN, "-H", "127.0.0.1", "-P", str(b().http_port),
           "-u", "guest", "-p", "guest", "-f", "tsv", "list", "queues", "name", "messages",
           "message_stats.publish", "message_stats.publish_details.rate"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    eq(p.returncode, 0, "rabbitmqadmin: %s" % (p.stdout + p.stderr))
    rows = [line.split("\t") for line in p.stdout.splitlines()]
    eq(rows[0], ["name", "messages", "message_stats.publish",
                 "message_stats.publish_details.rate"], "header")
    row = [r for r in rows[1:] if r[0] == name]
    eq(len(row), 1, "the queue's row in %r" % rows)
    eq(row[0][2], "40", "publish column")
    in_band(float(row[0][3]), "publish rate column")
    idle = [r for r in rows[1:] if r[0] == "rates-idle"]
    if idle:
        eq((idle[0][2], float(idle[0][3])), ("0", 0.0), "the idle queue's columns")
    p = subprocess.run(cmd[:-6] + ["show", "overview"], capture_output=True, text=True,
                       timeout=60)
    eq(p.returncode, 0, "rabbitmqadmin show overview: %s" % (p.stdout + p.stderr))
    conn.close()


if __name__ == "__main__":
    quaytest._broker = Broker(external_ok=False, http=True)
    run()
