"""Goal: what an operator sees of one quayd process.

Users files (hashed passwords, per-user vhosts, loopback-only users),
guest refused from a non-loopback peer, IPv6, the data directory lock,
--help, bad options, and a clean SIGTERM with clients connected.

Method: each test starts its own quayd with the options under test
(quaytest.Broker with extra arguments) and talks to it with pika. The
non-loopback peer is a network namespace this test creates, joined to the
host by a veth pair with addresses from 10.78.0.0/16 that exist only
between the two ends (needs root, as CI has).
"""
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F403

import pika  # noqa: E402

QUAYD = os.environ.get("QUAYD", "")


def hash_password(pw):
    out = subprocess.run([QUAYD, "--hash-password", pw], capture_output=True, text=True,
                         check=True)
    h = out.stdout.strip()
    assert len(h) == 48, h
    return h


def connect(b, user, password, vhost="/", host=None):
    params = pika.ConnectionParameters(host or b.host, b.port, vhost,
                                       pika.PlainCredentials(user, password),
                                       connection_attempts=1, socket_timeout=5)
    return pika.BlockingConnection(params)


def expect_login_error(b, user, password, vhost="/", code=None):
    try:
        connect(b, user, password, vhost).close()
    except pika.exceptions.ProbableAuthenticationError as e:
        return ("auth", str(e))
    except pika.exceptions.ProbableAccessDeniedError as e:
        return ("access", str(e))
    except pika.exceptions.AMQPConnectionError as e:
        return ("conn", repr(e))
    raise AssertionError("login as %s on %s unexpectedly succeeded" % (user, vhost))


def with_broker(extra_args, fn, host="127.0.0.1"):
    b = Broker(extra_args, host=host, external_ok=False)
    try:
        fn(b)
    finally:
        problems = b.stop()
        assert not problems, problems


def users_file(lines):
    path = os.path.join(tempfile.mkdtemp(prefix="quay-users-"), "users")
    with open(path, "w") as f:
        f.write("# name hash vhosts [loopback]\n\n" + "\n".join(lines) + "\n")
    return path


@test
def users_file_hashes_vhosts_and_permissions():
    path = users_file(["alice %s /,prod" % hash_password("s3cret"),
                       "bob %s prod loopback" % hash_password("hunter2")])
    assert "s3cret" not in open(path).read()

    def check(b):
        c = connect(b, "alice", "s3cret", "prod")
        ch = c.channel()
        ch.queue_declare("only-in-prod")
        c.close()
        # vhosts are separate namespaces
        c = connect(b, "alice", "s3cret", "/")
        ch = c.channel()
        try:
            ch.queue_declare("only-in-prod", passive=True)
            raise AssertionError("queue leaked across vhosts")
        except pika.exceptions.ChannelClosedByBroker as e:
            eq(e.reply_code, 404)
        c.close()
        connect(b, "bob", "hunter2", "prod").close()
        kind, text = expect_login_error(b, "bob", "hunter2", "/")
        assert kind == "access" and "access to vhost '/' refused for user 'bob'" in text, text
        kind, text = expect_login_error(b, "alice", "s3cret", "nowhere")
        assert kind == "access" and "vhost nowhere not found" in text, text
        # wrong password, unknown user, and guest (absent from this file)
        for user, pw in (("alice", "wrong"), ("mallory", "x"), ("guest", "guest")):
            kind, text = expect_login_error(b, user, pw)
            assert kind == "auth", (user, kind, text)
    with_broker(["--users", path], check)


@test
def malformed_users_file_refuses_to_start():
    path = users_file(["alice not-a-hash"])
    data = tempfile.mkdtemp(prefix="quay-data-")
    out = subprocess.run([QUAYD, "--listen", "127.0.0.1:%d" % free_port(), "--data", data,
                          "--users", path], capture_output=True, text=True, timeout=10)
    assert out.returncode != 0
    assert "users" in out.stderr and ":3:" in out.stderr, out.stderr


def netns_peer(fn):
    """Runs fn(host_ip, ns_name) with a network namespace whose only link
    is a veth pair to the host: a peer that is not loopback."""
    if os.geteuid() != 0:
        raise AssertionError("this test needs root (network namespaces); CI runs as root")
    tag = "%d%d" % (os.getpid() % 1000, random.randrange(100))
    ns, host_if, ns_if = "quayt%s" % tag, "qth%s" % tag, "qtn%s" % tag
    octet = random.randrange(1, 250)
    host_ip, ns_ip = "10.78.%d.1" % octet, "10.78.%d.2" % octet

    def ip(*args):
        subprocess.run(["ip"] + list(args), check=True, capture_output=True)
    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", host_ip + "/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", ns_ip + "/30", "dev", ns_if)
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        fn(host_ip, ns)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


PEER_LOGIN = r"""
import sys, pika
host, port, user, pw = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    c = pika.BlockingConnection(pika.ConnectionParameters(host, port, "/",
        pika.PlainCredentials(user, pw), connection_attempts=1, socket_timeout=5))
    c.channel().queue_declare("", exclusive=True)
    c.close()
    print("LOGIN-OK")
except pika.exceptions.ProbableAuthenticationError as e:
    print("LOGIN-REFUSED", e)
"""


@test
def guest_is_loopback_only_other_users_are_not():
    path = users_file(["guest %s / loopback" % hash_password("guest"),
                       "alice %s /" % hash_password("s3cret")])

    def in_namespace(host_ip, ns):
        def check(b):
            def login(user, pw):
                out = subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c",
                                      PEER_LOGIN, host_ip, str(b.port), user, pw],
                                     capture_output=True, text=True, timeout=30)
                return out.stdout.strip() + out.stderr.strip()[-300:]
            assert login("guest", "guest").startswith("LOGIN-REFUSED"), login("guest", "guest")
            assert login("alice", "s3cret") == "LOGIN-OK", login("alice", "s3cret")
            # ... while guest from loopback is fine
            connect(b, "guest", "guest", host="127.0.0.1").close()
        with_broker(["--users", path], check, host="0.0.0.0")
    netns_peer(in_namespace)


@test
def default_guest_refused_from_non_loopback():
    # With no users file quayd has guest/guest, loopback only (RabbitMQ's default).
    def in_namespace(host_ip, ns):
        def check(b):
            out = subprocess.run(["ip", "netns", "exec", ns, "/usr/bin/python3", "-c",
                                  PEER_LOGIN, host_ip, str(b.port), "guest", "guest"],
                                 capture_output=True, text=True, timeout=30)
            assert out.stdout.startswith("LOGIN-REFUSED"), out.stdout + out.stderr
        with_broker([], check, host="0.0.0.0")
    netns_peer(in_namespace)


@test
def serves_ipv6():
    def check(b):
        c = connect(b, "guest", "guest", host="::1")
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"over v6")
        eq(ch.basic_get(q, auto_ack=True)[2], b"over v6")
        c.close()
    with_broker([], check, host="::1")


@test
def second_quayd_on_same_data_dir_refuses():
    def check(b):
        out = subprocess.run([QUAYD, "--listen", "127.0.0.1:%d" % free_port(), "--data", b.data],
                             capture_output=True, text=True, timeout=10)
        assert out.returncode != 0
        assert "in use by another quayd" in out.stderr, out.stderr
    with_broker([], check)


@test
def help_and_bad_options():
    out = subprocess.run([QUAYD, "--help"], capture_output=True, text=True, timeout=10)
    eq(out.returncode, 0)
    for option in ("--listen", "--data", "--users", "--log-level", "--memory-high-watermark"):
        assert option in out.stdout, option
    out = subprocess.run([QUAYD, "--no-such-option"], capture_output=True, text=True, timeout=10)
    eq(out.returncode, 2)
    out = subprocess.run([QUAYD, "--frame-max", "12"], capture_output=True, text=True,
                         timeout=10)
    eq(out.returncode, 2)


@test
def json_log_lines_say_who_opened_and_closed():
    """--log-format json: every line of quayd's log is one JSON object with
    time, level and message; a client's connection is logged when it opens
    and closes, with its conn, peer, user and vhost as members. (One broker
    only: the cluster harness reads its brokers' logs as text.)"""
    if CLUSTERED:
        print("# one broker only")
        return

    def run(b):
        c = connect(b, "guest", "guest")
        c.channel().queue_declare("", exclusive=True)
        c.close()

        def lines():
            return [json.loads(line) for line in b.stderr_text().splitlines() if line.strip()]

        def closed_pairs():
            entries = lines()
            opened = {e["conn"]: e for e in entries if e["message"] == "opened"}
            return [(opened[e["conn"]], e) for e in entries
                    if e["message"] == "closed" and e.get("conn") in opened]
        wait_until(closed_pairs, 5, what="a connection's open and close logged")
        for e in lines():
            assert {"time", "level", "message"} <= set(e), e
        for opened, closed in closed_pairs():
            for e in (opened, closed):
                eq((e["level"], e["user"], e["vhost"]), ("info", "guest", "/"), e["message"])
                assert e["conn"].isdigit() and ":" in e["peer"], e
    with_broker(["--log-format", "json", "--log-level", "info"], run)
    out = subprocess.run([QUAYD, "--log-format", "xml"], capture_output=True, text=True,
                         timeout=10)
    eq(out.returncode, 2)
    assert "--log-format" in out.stderr, out.stderr


@test
def sigterm_closes_clients_with_320_and_exits_0():
    b = Broker([], external_ok=False)
    c = connect(b, "guest", "guest")
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, lambda *a: None)
    b.proc.send_signal(signal.SIGTERM)
    try:
        deadline = time.time() + 5
        while time.time() < deadline:
            c.process_data_events(time_limit=0.2)
        raise AssertionError("connection was not closed by the shutdown")
    except pika.exceptions.ConnectionClosedByBroker as e:
        eq(e.reply_code, 320)
        assert "CONNECTION_FORCED" in e.reply_text, e.reply_text
    eq(b.proc.wait(5), 0)
    b.proc = None


if __name__ == "__main__":
    run()
