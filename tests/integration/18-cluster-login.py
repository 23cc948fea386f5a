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
from clustertest import Cluster, closer, metric, run, test  # noqa: E402
from quaytest import (CHANNEL_OPEN_OK, CONNECTION_OPEN_OK, CONNECTION_START,  # noqa: E402
                      CONNECTION_TUNE, PROTOCOL_HEADER, eq, expect_close,
                      expect_closed_socket, expect_method, gen_channel_open,
                      gen_basic_get, gen_connection_start_ok, gen_method, gen_open,
                      gen_queue_declare, gen_tune_ok, handshake, longstr, shortstr, bits,
                      gen_content, long_, longlong, read_content, read_method, table)

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


def peer_session(name):
    """A logged-in peer link to the member, channel 1 open in vhost "/"."""
    s, _, _ = start(member().amqp_port)
    login(s, name, challenge(s, name))
    expect_method(s, *CONNECTION_TUNE)
    s.sendall(gen_tune_ok(heartbeat=0))
    s.sendall(gen_open("/"))
    expect_method(s, *CONNECTION_OPEN_OK)
    s.sendall(gen_method(1, 20, 10, shortstr("/")))
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)
    s.sendall(gen_method(1, 85, 10, bits(False)))   # confirm.select
    expect_method(s, 85, 11, channel=1)
    return s


def gen_forward(channel, targets_table, body=b"x", dead=False, same=False, origin=(0, 0, False)):
    """basic.quay-forward (60, 200): exchange, routing key, bits, targets,
    then the origin (stream, seq, resent); stream 0: none."""
    stream, seq, resent = origin
    args = (shortstr("") + shortstr("rk") + bits(dead, same) + targets_table
            + longlong(stream) + longlong(seq) + bits(resent))
    return gen_method(channel, 60, 200, args) + gen_content(channel, body)


@test(timeout=60)
def a_peers_bad_or_stale_frames_are_refused_not_fatal():
    """A peer that lies or lags (forwards to queues that are not ours or
    under a wrong epoch, a targets table of the wrong types, 'same targets'
    with none before, a settle or a replicate for nothing, a sync far
    ahead) is answered with nacks or ignored: the link and the broker stay
    up, and a client is served throughout. A forward naming a queue our
    map does not have, at an epoch it has passed, is a publish to a queue
    deleted since (fence_forward_gone): confirmed, as one broker confirms
    a publish routed to a queue that then went."""
    s = peer_session("peer-3")
    frames = [
        gen_forward(1, table({"no-such-queue": 7})),            # gone: ack
        gen_forward(1, table({"q": "not an epoch"})),           # wrong type: nack
        gen_forward(1, table({})),                              # no target: nack
        gen_forward(1, long_(0), same=True),                    # nothing before: nack
        gen_forward(1, table({"amq.quay.map": 0}), body=b"\xff" * 40),  # a junk entry
        gen_method(1, 60, 202, shortstr("q") + longlong(3) + longlong(9) + longlong(12) +
                   bits(False)),                                # settle (a run): not a backup
        gen_method(1, 60, 201, shortstr("q") + shortstr("") + shortstr("") + longlong(1) +
                   longlong(1) + longlong(0) + longlong(0)) + gen_content(1, b"r"),          # replicate: not a backup
    ]
    s.sendall(b"".join(frames))
    answers = []
    while len(answers) < 5:                  # forwards and the replicate are answered
        m = read_method(s, timeout=5)
        if m.id in ((60, 80), (60, 120)):
            tag, multiple = m.args.longlong(), m.args.bit()
            answers.append((m.id, tag, multiple))
    eq(answers, [((60, 80), 1, False)] + [((60, 120), tag, False) for tag in range(2, 6)])
    # A sync far ahead holds this link a while (MEMBER_SYNC_WAIT_MS), then
    # it is served with the map it has: the channel still answers.
    s.sendall(gen_method(1, 60, 203, longlong(1 << 40) + bits(False)))  # no answer asked
    s.sendall(gen_forward(1, table({"q": "not an epoch"})))
    m = read_method(s, timeout=10)
    eq(m.id, (60, 120), "answered after the sync timed out")
    # Asked for an answer (visible.c): basic.quay-synced with the map's
    # version, once there.
    s.sendall(gen_method(1, 60, 203, longlong(1) + bits(True)))
    m = read_method(s, timeout=10)
    eq(m.id, (60, 204), "basic.quay-synced")
    assert m.args.longlong() >= 1
    c = socket.create_connection(("127.0.0.1", member().amqp_port), timeout=5)
    handshake(c)
    c.close()
    assert member().alive()
    s.close()


def answers_through(s, last_tag):
    """{tag: True (ack) / False (nack)} for the peer channel's tags 1..last_tag."""
    fates, done = {}, 0
    while done < last_tag:
        m = read_method(s, timeout=10)
        if m.id not in ((60, 80), (60, 120)):
            continue
        tag, multiple = m.args.longlong(), m.args.bit()
        for t in range(done + 1 if multiple else tag, tag + 1):
            fates[t] = m.id == (60, 80)
        done = max(done, tag)
    return fates


@test(timeout=60)
def a_resent_forward_is_acked_not_enqueued_twice():
    """Forward origins (broker/origin.h), on the wire: a resend of what the
    queue took is acked and not enqueued; once the channel refused a
    forward (a stale epoch), it records no more, so the refused one's
    resend is taken even though a newer forward of its stream was taken
    first (a mark would have hidden it: a lost message)."""
    c = socket.create_connection(("127.0.0.1", member().amqp_port), timeout=5)
    handshake(c)
    c.sendall(gen_channel_open(1) + gen_queue_declare(1, "origins"))
    expect_method(c, *CHANNEL_OPEN_OK, channel=1)
    expect_method(c, 50, 11, channel=1)
    epoch = next(q for q in member().api_get("/api/queues") if q["name"] == "origins")["epoch"]
    frozen = metric(member(), "quay_forward_channels_frozen_total")
    s = peer_session("peer-4")
    stream = 0x5EED0001
    target, stale = table({"origins": epoch}), table({"origins": epoch - 1})
    s.sendall(b"".join([
        gen_forward(1, target, b"m1", origin=(stream, 1, False)),  # 1: taken
        gen_forward(1, target, b"m1", origin=(stream, 1, True)),   # 2: a resend: held back
        gen_forward(1, stale, b"m2", origin=(stream, 2, False)),   # 3: stale: nack
        gen_forward(1, target, b"m3", origin=(stream, 3, False)),  # 4: taken, not recorded
        gen_forward(1, target, b"m2", origin=(stream, 2, True)),   # 5: m2 resent: taken
        gen_forward(1, target, b"m1", origin=(stream, 1, True)),   # 6: held back again
        gen_forward(1, target, b"m4", origin=(0, 0, False)),       # 7: no origin: taken
    ]))
    eq(answers_through(s, 7), {1: True, 2: True, 3: False, 4: True, 5: True, 6: True, 7: True},
       "answers")
    bodies = []
    while True:
        c.sendall(gen_basic_get(1, "origins", no_ack=True))
        m = read_method(c, timeout=5)
        if m.id == (60, 72):  # get-empty
            break
        eq(m.id, (60, 71), "get-ok")
        bodies.append(read_content(c)[1])
    eq(bodies, [b"m1", b"m3", b"m2", b"m4"], "the queue")
    # The channel that stopped recording is counted, once.
    eq(metric(member(), "quay_forward_channels_frozen_total"), frozen + 1, "frozen channels")
    s.close()
    c.close()


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


if __name__ == "__main__":
    run(closer(lambda: cluster))
