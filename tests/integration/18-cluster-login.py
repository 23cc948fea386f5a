"""Goal: a clustered broker admits its peers' links (mechanism QUAY-CLUSTER, a SASL challenge,
src/broker/auth.h) exactly as specified, refuses a wrong proof like a bad
password, and lets a peer name each channel's vhost in channel.open; a
broker without a cluster secret offers nothing new.

Method: one quayd started by tests/cluster/clustertest.py with a known
secret file, driven through raw frames from quaytest's own encoder; the
proof is computed here with Python's hmac, independently of the C code that
the link (tests/unit/test_link.c) and the server share.
"""
import hashlib
import hmac
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import Cluster, run, test  # noqa: E402
from quaytest import (CHANNEL_OPEN_OK, CONNECTION_OPEN_OK, CONNECTION_START,  # noqa: E402
                      CONNECTION_TUNE, PROTOCOL_HEADER, eq, expect_close,
                      expect_closed_socket, expect_method, gen_channel_open,
                      gen_connection_start_ok, gen_method, gen_open, gen_tune_ok, handshake,
                      longstr, shortstr)

CONNECTION_SECURE = (10, 20)

SECRET = "integration-cluster-secret-0123456789"
cluster = None


def member():
    global cluster
    if cluster is None:
        cluster = Cluster(secret=SECRET)
        cluster.add("solo")
    return cluster.members[0]


def start(port):
    """Connects and reads connection.start: (socket, mechanisms, properties)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(PROTOCOL_HEADER)
    m = expect_method(s, *CONNECTION_START)
    m.args.octet(), m.args.octet()
    props = m.args.table()
    mechanisms = m.args.longstr().decode().split()
    return s, mechanisms, props


def proof(secret, nonce, name):
    mac = hmac.new(secret.encode(), b"quay-link v1" + nonce.encode() + name.encode(),
                   hashlib.sha256)
    return mac.hexdigest().encode()


def challenge(s, name):
    """start-ok with QUAY-CLUSTER; returns the server's nonce (connection.secure)."""
    s.sendall(gen_connection_start_ok(mechanism="QUAY-CLUSTER", response=name.encode()))
    m = expect_method(s, *CONNECTION_SECURE)
    return m.args.longstr().decode()


def login(s, name, nonce, secret=SECRET):
    response = name.encode() + b"\x00" + proof(secret, nonce, name)
    s.sendall(gen_method(0, 10, 21, longstr(response)))  # connection.secure-ok


@test(timeout=60)
def clustered_broker_accepts_quay_cluster_with_a_fresh_nonce():
    port = member().amqp_port
    s1, mechanisms, props1 = start(port)
    s2, _, props2 = start(port)
    # Offered as by one broker: QUAY-CLUSTER is accepted, not listed, and
    # the nonce is a challenge for a peer only, not a server property.
    eq(mechanisms, ["PLAIN", "AMQPLAIN"], "mechanisms")
    assert "quay_nonce" not in props1, props1
    nonces = [challenge(s, "peer-0") for s in (s1, s2)]
    for nonce in nonces:
        assert len(nonce) == 32 and all(c in "0123456789abcdef" for c in nonce), nonce
    assert nonces[0] != nonces[1], "a nonce per connection"
    s1.close()
    s2.close()


@test(timeout=60)
def peer_logs_in_and_names_vhosts_per_channel():
    s, _, props = start(member().amqp_port)
    login(s, "peer-1", challenge(s, "peer-1"))
    expect_method(s, *CONNECTION_TUNE)
    s.sendall(gen_tune_ok(heartbeat=0))
    s.sendall(gen_open("/"))
    expect_method(s, *CONNECTION_OPEN_OK)
    # channel.open's reserved shortstr names the vhost: a missing one is
    # refused on that channel only (530), "/" works, empty means "/".
    s.sendall(gen_method(1, 20, 10, shortstr("nope")))
    close = expect_close(s, connection=False)
    eq(close, (530, "NOT_ALLOWED - vhost nope not found", 20, 10), "channel.close")
    s.sendall(gen_method(2, 20, 10, shortstr("/")))
    expect_method(s, *CHANNEL_OPEN_OK, channel=2)
    s.sendall(gen_channel_open(3))
    expect_method(s, *CHANNEL_OPEN_OK, channel=3)
    s.close()


@test(timeout=60)
def wrong_proof_is_refused_like_a_bad_password():
    for secret, nonce_of in (("not-the-secret", lambda n: n),
                             (SECRET, lambda n: "0" * 32)):  # a stale nonce
        s, _, props = start(member().amqp_port)
        login(s, "peer-2", nonce_of(challenge(s, "peer-2")), secret=secret)
        close = expect_close(s, connection=True)
        eq(close, (403, "ACCESS_REFUSED - Login was refused using authentication mechanism "
                   "QUAY-CLUSTER. For details see the broker logfile.", 0, 0), "refusal")
        expect_closed_socket(s)
    assert "cluster login refused" in member().log_text()


@test(timeout=60)
def plain_logins_are_unchanged_on_a_clustered_broker():
    s = socket.create_connection(("127.0.0.1", member().amqp_port), timeout=5)
    info = handshake(s)
    eq(info["mechanisms"], ["PLAIN", "AMQPLAIN"], "mechanisms")
    # A client's channel.open reserved field stays ignored.
    s.sendall(gen_method(1, 20, 10, shortstr("nope")))
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)
    s.close()


def cleanup(failed):
    if cluster is None:
        return []
    cluster.failed = failed
    return cluster.close()


if __name__ == "__main__":
    run(cleanup)
