"""Goal: RabbitMQ's configure / write / read permissions from the users file
(`permission USER VHOST CONFIGURE WRITE READ`), checked by the broker the
client is connected to, with RabbitMQ's 403 ACCESS_REFUSED wording; a
refusal closes the channel and changes nothing; users without a permission
line keep full access; a bad regex or an unknown user refuses the file.

Method: one quayd (or, with QUAY_TEST_MODE=cluster, a 3-broker cluster
reached through one broker) with a users file: "limited" may configure
and read only ^mine- names and write to the default exchange and ^mine-
names; "free" has no permission line. Real pika clients try each method
and check the reply code and text, then check with the free user that the
refused operations left nothing behind.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F403

import pika  # noqa: E402

QUAYD = os.environ.get("QUAYD", "")


def hash_password(pw):
    out = subprocess.run([QUAYD, "--hash-password", pw], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def users_file(lines):
    path = os.path.join(tempfile.mkdtemp(prefix="quay-users-"), "users")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def connect(b, user, password="pw"):
    params = pika.ConnectionParameters(b.host, b.port, "/",
                                       pika.PlainCredentials(user, password),
                                       connection_attempts=1, socket_timeout=5)
    return pika.BlockingConnection(params)


def refused(text):
    """RabbitMQ's reply text for a refusal of the limited user in /."""
    return "ACCESS_REFUSED - %s refused for user 'limited'" % text


def expect_403(c, fn, text):
    """Runs fn(channel) on a fresh channel of c; expects a 403 channel close."""
    ch = c.channel()
    try:
        fn(ch)
        # a publish is asynchronous: a round trip shows the close
        ch.queue_declare("mine-sync", passive=False)
        raise AssertionError("%s was not refused" % text)
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
        eq(e.reply_text, refused(text))


def lines():
    h = hash_password("pw")
    return ["guest %s / loopback tags=administrator" % hash_password("guest"),
            "limited %s /" % h,
            "free %s /" % h,
            r'permission limited / ^mine- ^amq\.default$|^mine- ^mine-',
            'permission guest / .* .* .*']


def declare_and_delete(b):
    c = connect(b, "limited")
    ch = c.channel()
    ch.queue_declare("mine-q")
    ch.exchange_declare("mine-x", "fanout")
    expect_403(c, lambda ch: ch.queue_declare("other-q"),
               "configure access to queue 'other-q' in vhost '/'")
    expect_403(c, lambda ch: ch.exchange_declare("other-x", "fanout"),
               "configure access to exchange 'other-x' in vhost '/'")
    # a server-named queue is amq.gen-...: not ^mine-
    ch = c.channel()
    try:
        ch.queue_declare("", exclusive=True)
        raise AssertionError("a server-named queue was allowed")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 403)
        assert e.reply_text.startswith("ACCESS_REFUSED - configure access to queue 'amq.gen-"), \
            e.reply_text
    # passive declares need no permission (RabbitMQ); missing is still 404
    f = connect(b, "free")
    fch = f.channel()
    fch.queue_declare("theirs-q")
    fch.exchange_declare("theirs-x", "direct")
    ch = c.channel()
    ch.queue_declare("theirs-q", passive=True)
    ch.exchange_declare("theirs-x", passive=True)
    expect_403(c, lambda ch: ch.queue_delete("theirs-q"),
               "configure access to queue 'theirs-q' in vhost '/'")
    expect_403(c, lambda ch: ch.exchange_delete("theirs-x"),
               "configure access to exchange 'theirs-x' in vhost '/'")
    # nothing changed: the free user's objects are still there, refused ones absent
    fch.queue_declare("theirs-q", passive=True)
    fch.exchange_declare("theirs-x", passive=True)
    for name in ("other-q",):
        try:
            f.channel().queue_declare(name, passive=True)
            raise AssertionError("refused queue %s exists" % name)
        except pika.exceptions.ChannelClosedByBroker as e:
            eq(e.reply_code, 404)
    try:
        f.channel().exchange_declare("other-x", passive=True)
        raise AssertionError("refused exchange other-x exists")
    except pika.exceptions.ChannelClosedByBroker as e:
        eq(e.reply_code, 404)
    f.close()
    c.close()


def publish_consume_get(b):
    f = connect(b, "free")
    fch = f.channel()
    fch.queue_declare("theirs-q")
    fch.exchange_declare("theirs-x", "direct")
    fch.queue_bind("theirs-q", "theirs-x", "theirs-q")
    fch.queue_purge("theirs-q")
    c = connect(b, "limited")
    ch = c.channel()
    ch.confirm_delivery()
    ch.queue_declare("mine-q")
    ch.queue_purge("mine-q")
    for i in range(3):  # the second and third use the channel's cache
        ch.basic_publish("", "mine-q", b"m%d" % i)
    ch.exchange_declare("mine-x", "fanout")
    ch.basic_publish("mine-x", "", b"to mine-x")
    ch.basic_publish("", "mine-q", b"m3")  # back to the default exchange
    expect_403(c, lambda ch: ch.basic_publish("theirs-x", "theirs-q", b"no"),
               "write access to exchange 'theirs-x' in vhost '/'")
    expect_403(c, lambda ch: ch.basic_publish("amq.direct", "theirs-q", b"no"),
               "write access to exchange 'amq.direct' in vhost '/'")
    # read: get and consume on mine-q only
    ch = c.channel()
    method, _, body = ch.basic_get("mine-q", auto_ack=True)
    eq(body, b"m0")
    ch.basic_consume("mine-q", lambda *a: None, auto_ack=True)
    expect_403(c, lambda ch: ch.basic_get("theirs-q", auto_ack=True),
               "read access to queue 'theirs-q' in vhost '/'")
    expect_403(c, lambda ch: ch.basic_consume("theirs-q", lambda *a: None),
               "read access to queue 'theirs-q' in vhost '/'")
    expect_403(c, lambda ch: ch.queue_purge("theirs-q"),
               "read access to queue 'theirs-q' in vhost '/'")
    # the refused publishes routed nothing
    fch.basic_publish("theirs-x", "theirs-q", b"free's own")
    wait_until(lambda: fch.queue_declare("theirs-q", passive=True).method.message_count == 1,
               5, what="the free user's one message")
    c.close()
    f.close()


def binds(b):
    f = connect(b, "free")
    fch = f.channel()
    fch.queue_declare("theirs-q")
    fch.exchange_declare("theirs-x", "direct")
    c = connect(b, "limited")
    ch = c.channel()
    ch.queue_declare("mine-q")
    ch.exchange_declare("mine-x", "fanout")
    ch.exchange_declare("mine-x2", "fanout")
    ch.queue_bind("mine-q", "mine-x")
    ch.queue_unbind("mine-q", "mine-x")
    ch.exchange_bind("mine-x2", "mine-x")
    ch.exchange_unbind("mine-x2", "mine-x")
    # queue.bind: write on the queue, read on the exchange
    expect_403(c, lambda ch: ch.queue_bind("theirs-q", "mine-x"),
               "write access to queue 'theirs-q' in vhost '/'")
    expect_403(c, lambda ch: ch.queue_bind("mine-q", "theirs-x"),
               "read access to exchange 'theirs-x' in vhost '/'")
    expect_403(c, lambda ch: ch.queue_unbind("mine-q", "theirs-x"),
               "read access to exchange 'theirs-x' in vhost '/'")
    # exchange.bind: write on the destination, read on the source
    expect_403(c, lambda ch: ch.exchange_bind("theirs-x", "mine-x"),
               "write access to exchange 'theirs-x' in vhost '/'")
    expect_403(c, lambda ch: ch.exchange_bind("mine-x2", "theirs-x"),
               "read access to exchange 'theirs-x' in vhost '/'")
    c.close()
    f.close()


def free_user_has_full_access(b):
    f = connect(b, "free")
    ch = f.channel()
    ch.exchange_declare("any-x", "topic")
    ch.queue_declare("any-q")
    ch.queue_bind("any-q", "any-x", "#")
    ch.basic_publish("any-x", "k", b"x")
    ch.basic_publish("", "any-q", b"y")
    wait_until(lambda: ch.queue_declare("any-q", passive=True).method.message_count == 2, 5,
               what="two messages in any-q")
    eq(ch.basic_get("any-q", auto_ack=True)[2], b"x")
    ch.queue_purge("any-q")
    ch.queue_delete("any-q")
    ch.exchange_delete("any-x")
    f.close()


@test
def permissions_refuse_with_rabbitmq_wording_and_change_nothing():
    path = users_file(lines())
    b = Broker(["--users", path, "--log-level", "info"], external_ok=False)
    try:
        declare_and_delete(b)
        publish_consume_get(b)
        binds(b)
        free_user_has_full_access(b)
        # each refusal is logged with the user and the peer
        log = b.stderr_text()
        assert "user=limited vhost=/ refused configure access to queue 'other-q'" in log, log
        assert "peer=127.0.0.1:" in log, log
    finally:
        problems = b.stop()
    assert not problems, problems


def start_fails(lines_):
    path = users_file(lines_)
    data = tempfile.mkdtemp(prefix="quay-data-")
    out = subprocess.run([QUAYD, "--listen", "127.0.0.1:%d" % free_port(), "--data", data,
                          "--users", path], capture_output=True, text=True, timeout=10)
    assert out.returncode != 0, out
    return out.stderr


@test
def bad_permission_lines_refuse_to_start():
    h = hash_password("pw")
    err = start_fails(["u %s /" % h, "permission u / ^( .* .*"])
    assert ":2: bad configure regex '^('" in err, err
    err = start_fails(["u %s /" % h, "permission nobody / .* .* .*"])
    assert ":2: permission for unknown user 'nobody'" in err, err
    err = start_fails(["u %s /" % h, "permission u / .* .*"])
    assert ":2: expected permission USER VHOST CONFIGURE WRITE READ" in err, err


if __name__ == "__main__":
    run()
