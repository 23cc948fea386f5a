"""06-clients: the same round trip with several unchanged client libraries.

Goal: clients other than pika work unchanged: py-amqp (`import amqp`),
kombu, and rabbitmq-c's command-line tools (Debian package amqp-tools).

Method: for each client, declare a queue, publish 1000 messages (with
publisher confirms where the client supports them), consume them all, ack,
and check count, order and content; then clean up.  The amqp-tools tests
skip (pass with a message) only if the binaries are not installed.
"""

import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403

N = 1000


@test(timeout=60)
def py_amqp_round_trip_with_confirms():
    import amqp
    b = broker()
    conn = track(amqp.Connection(host="%s:%d" % (b.host, b.port), userid="guest",
                                 password="guest", virtual_host="/", confirm_publish=True,
                                 connect_timeout=5))
    conn.connect()
    props = conn.server_properties
    eq(props["capabilities"].get("publisher_confirms"), True)
    ch = conn.channel()
    q, count, consumers = ch.queue_declare("", exclusive=True)
    eq((count, consumers), (0, 0))
    for i in range(N):   # confirm_publish: each publish waits for its ack
        ch.basic_publish(amqp.Message(b"amqp-%d" % i, content_type="text/plain",
                                      application_headers={"i": i}),
                         exchange="", routing_key=q)
    eq(ch.queue_declare(q, passive=True)[1], N)
    got = []

    def on_message(msg):
        got.append((msg.body, msg.properties.get("application_headers"),
                    msg.properties.get("content_type")))
        msg.channel.basic_ack(msg.delivery_tag)
    ch.basic_qos(0, 100, False)
    tag = ch.basic_consume(q, callback=on_message)
    deadline = time.time() + 30
    while len(got) < N and time.time() < deadline:
        conn.drain_events(timeout=5)
    eq(len(got), N)
    eq(got[0], (b"amqp-0", {"i": 0}, "text/plain"))
    eq([g[0] for g in got], [b"amqp-%d" % i for i in range(N)], "order")
    ch.basic_cancel(tag)
    eq(ch.queue_delete(q), 0, "queue empty after acks")
    conn.close()


@test(timeout=60)
def py_amqp_get_and_reject():
    import amqp
    b = broker()
    conn = track(amqp.Connection(host="%s:%d" % (b.host, b.port), userid="guest",
                                 password="guest"))
    conn.connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True)[0]
    ch.basic_publish(amqp.Message(b"one"), "", q)
    ch.basic_publish(amqp.Message(b"two"), "", q)
    m = None
    deadline = time.time() + 5
    while m is None and time.time() < deadline:
        m = ch.basic_get(q)
    eq(m.body, b"one")
    ch.basic_reject(m.delivery_tag, requeue=True)
    m = ch.basic_get(q, no_ack=True)
    eq((m.body, m.delivery_info["redelivered"]), (b"one", True))
    conn.close()


@test(timeout=60)
def kombu_simple_queue():
    import kombu
    name = uniq("kombu")
    with kombu.Connection(amqp_url("/"), transport_options={"confirm_publish": True},
                          connect_timeout=5) as conn:
        sq = conn.SimpleQueue(name)
        try:
            for i in range(N):
                sq.put({"i": i, "text": "kombu-%d" % i})
            eq(sq.qsize(), N)
            got = []
            for _ in range(N):
                msg = sq.get(block=True, timeout=5)
                got.append(msg.payload["i"])
                msg.ack()
            eq(got, list(range(N)), "order")
            eq(sq.qsize(), 0)
        finally:
            # close the SimpleQueue (its consumer) first: deleting a queue under
            # a live consumer makes the broker send basic.cancel, which kombu
            # raises as ConsumerCancelled.
            sq.close()
            ch = conn.channel()
            ch.queue_delete(name)
            ch.exchange_delete(name)
            ch.close()


@test(timeout=60)
def kombu_simple_buffer_again_and_again():
    """kombu's SimpleBuffer (an auto-delete exchange and queue) made anew
    right after the previous one went with its consumer, on one connection:
    each round's declares must see the last round's deletions, as on one
    broker (through a proxy it once got 404 NOT_FOUND - no exchange on its
    bind)."""
    import kombu
    name = uniq("kombu-buffer")
    with kombu.Connection(amqp_url("/"), connect_timeout=5) as conn:
        for i in range(15):
            buf = conn.SimpleBuffer(name)
            buf.put({"i": i})
            msg = buf.get(block=True, timeout=5)
            eq(msg.payload, {"i": i}, "round %d" % i)
            msg.ack()
            buf.close()


def _tool(name):
    path = shutil.which(name)
    if not path:
        print("# SKIP: %s not installed (Debian package amqp-tools)" % name)
    return path


def _run(args, stdin=None, timeout=60):
    b = broker()
    full = [args[0], "--server", b.host, "--port", str(b.port),
            "--username", "guest", "--password", "guest"] + args[1:]
    p = subprocess.run(full, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@test(timeout=120)
def rabbitmq_c_tools():
    tools = [_tool(t) for t in ("amqp-declare-queue", "amqp-publish", "amqp-get",
                                "amqp-consume", "amqp-delete-queue")]
    if not all(tools):
        return
    name = uniq("amqptools")
    rc, out, err = _run(["amqp-declare-queue", "-q", name])
    eq((rc, out.strip()), (0, name.encode()), "declare-queue (%r)" % err)
    try:
        # server-named queue: the tool prints the generated name
        rc, out, err = _run(["amqp-declare-queue", "-q", ""])
        eq(rc, 0, "declare '' (%r)" % err)
        assert out.startswith(b"amq.gen-"), out
        rc, _, err = _run(["amqp-delete-queue", "-q", out.strip().decode()])
        eq(rc, 0, "delete server-named queue (%r)" % err)
        # one publisher process, 1000 messages (one per line)
        lines = b"".join(b"tool-%d\n" % i for i in range(N))
        rc, out, err = _run(["amqp-publish", "-r", name, "-l"], stdin=lines)
        eq(rc, 0, "publish -l (%r)" % err)
        rc, out, err = _run(["amqp-publish", "-r", name, "-b", "single",
                             "-C", "text/plain", "-H", "k: v"])
        eq(rc, 0, "publish -b (%r)" % err)
        # amqp-get takes the first message (-l keeps the newline in the body)
        rc, out, err = _run(["amqp-get", "-q", name])
        eq((rc, out), (0, b"tool-0\n"), "amqp-get (%r)" % err)
        # amqp-consume runs `cat` once per message, with acks, prefetch 50
        rc, out, err = _run(["amqp-consume", "-q", name, "-c", str(N), "-p", "50", "cat"])
        eq(rc, 0, "amqp-consume (%r)" % err)
        eq(out, b"".join(b"tool-%d\n" % i for i in range(1, N)) + b"single", "consumed bodies")
        # empty queue: amqp-get fails
        rc, out, err = _run(["amqp-get", "-q", name])
        assert rc != 0, "amqp-get on empty queue should fail"
        # if-empty delete succeeds now
        rc, out, err = _run(["amqp-delete-queue", "-q", name, "--if-empty"])
        eq(rc, 0, "delete (%r)" % err)
    finally:
        _run(["amqp-delete-queue", "-q", name])


if __name__ == "__main__":
    run()
