#!/usr/bin/python3
"""33-cluster-tls: the links between brokers over AMQPS with mutual certificates.

Goal: with --cluster-tls a cluster works as without it (a message
published through one broker and consumed through another crosses two
links, now TLS), each broker advertises its AMQPS address for the links,
and a peer's login (QUAY-CLUSTER) is refused without a verified client
certificate, on the TLS port and on the plain one, even before the secret
is checked.

Method: three quayd formed by tests/cluster/clustertest.py, each with
--tls-listen, the same broker certificate (made with the openssl command)
and --tls-verify peer; pika clients; raw frames for the refusals.
"""
import hashlib
import hmac
import os
import socket
import ssl
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import Cluster, closer, connect, run, test, wait_until  # noqa: E402
from quaytest import (ACCESS_REFUSED, CONNECTION_START, PROTOCOL_HEADER, eq,  # noqa: E402
                      expect_close, expect_method, free_port, gen_connection_start_ok,
                      gen_method, longstr, make_tls_files)

CONNECTION_SECURE = (10, 20)
SECRET = "cluster-tls-secret-0123456789abcdef"
PKI = make_tls_files(tempfile.mkdtemp(prefix="quay-itest-ctls-"))
TLS_PORTS = {}
cluster = None


def members():
    global cluster
    if cluster is None:
        cluster = Cluster(secret=SECRET)
        cluster.failed = True  # until formed: later tests fail at once

        def per(name):
            TLS_PORTS[name] = free_port()
            return {"extra_args": [
                "--tls-listen", "127.0.0.1:%d" % TLS_PORTS[name], "--tls-cert", PKI["server.pem"],
                "--tls-key", PKI["server.key"], "--tls-ca", PKI["ca.pem"], "--tls-verify", "peer",
                "--cluster-tls"]}
        cluster.form(["a", "b", "c"], per=per)
        cluster.failed = False
    assert not cluster.failed, "the cluster did not form"
    return cluster.members


@test(timeout=120)
def messages_cross_tls_links():
    a, b, c = members()
    for m in (a, b, c):
        log = m.log_text()
        assert "listening for AMQPS on 127.0.0.1:%d" % TLS_PORTS[m.name] in log, log[-2000:]
    # The map holds the AMQPS addresses: the links connect there.
    brokers = a.api_get("/api/cluster")["brokers"]
    text = repr(brokers)
    for m in (a, b, c):
        assert ":%d" % TLS_PORTS[m.name] in text, text
    pub, sub = connect(b), connect(c)
    ch = pub.channel()
    ch.confirm_delivery()
    ch.queue_declare("ctls-q", durable=False)
    bodies = [os.urandom(1024) for _ in range(500)]
    for body in bodies:
        ch.basic_publish("", "ctls-q", body)
    sch = sub.channel()
    sch.basic_qos(prefetch_count=50)
    got = []
    for method, _props, body in sch.consume("ctls-q", inactivity_timeout=10):
        assert body is not None, "timed out after %d" % len(got)
        got.append(body)
        sch.basic_ack(method.delivery_tag)
        if len(got) == len(bodies):
            break
    sch.cancel()
    eq(got, bodies, "the messages through two brokers")
    ch.queue_delete("ctls-q")
    pub.close()
    sub.close()


def cluster_login_refused(sock):
    """QUAY-CLUSTER with a correct proof: refused (403) for want of a
    certificate, whatever the secret says."""
    sock.sendall(PROTOCOL_HEADER)
    expect_method(sock, *CONNECTION_START)
    caps = {"authentication_failure_close": True}
    sock.sendall(gen_connection_start_ok(mechanism="QUAY-CLUSTER", response=b"x",
                                         capabilities=caps))
    m = None
    try:
        m = expect_method(sock, *CONNECTION_SECURE)
    except Exception:
        pass
    if m is not None:
        nonce = m.args.longstr().decode()
        mac = hmac.new(SECRET.encode(), b"quay-link v1" + nonce.encode() + b"x", hashlib.sha256)
        sock.sendall(gen_method(0, 10, 21, longstr(b"x\x00" + mac.hexdigest().encode())))
    code, text, _, _ = expect_close(sock, connection=True)
    eq(code, ACCESS_REFUSED, "a peer without a certificate")
    assert "QUAY-CLUSTER" in text, text


@test(timeout=60)
def a_peer_without_a_certificate_is_refused():
    a, b, c = members()
    ctx = ssl.create_default_context(cafile=PKI["ca.pem"])
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", TLS_PORTS["b"]), timeout=5),
                        server_hostname="localhost")
    cluster_login_refused(s)
    s.close()
    s = socket.create_connection(("127.0.0.1", b.amqp_port), timeout=5)
    cluster_login_refused(s)
    s.close()
    assert "no verified TLS client certificate" in b.log_text(), b.log_text()[-2000:]
    # The cluster is unharmed: a client still gets through every broker.
    for m in (a, b, c):
        conn = connect(m)
        conn.channel()
        conn.close()


@test(timeout=60)
def raft_speaks_only_tls_with_a_certificate():
    """The Raft transport (the cluster port) is TLS too: a TLS client
    with a certificate of the cluster's CA completes a handshake and sees
    the broker's certificate; one without a certificate is refused; the
    plain handshake (QYRA hello) gets no QYRA answer. The map commits
    through it (the other tests declared and deleted queues)."""
    a, b, c = members()
    port = b.cluster_port
    ctx = ssl.create_default_context(cafile=PKI["ca.pem"])
    ctx.load_cert_chain(PKI["server.pem"], PKI["server.key"])
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                        server_hostname="localhost")
    assert s.getpeercert()["subject"], s.getpeercert()
    s.close()
    bare = ssl.create_default_context(cafile=PKI["ca.pem"])
    s = bare.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                         server_hostname="localhost")
    try:
        # TLS 1.3: the server's refusal of a missing certificate arrives
        # with the first read after the handshake.
        s.sendall(b"QYRA")
        got = s.recv(16)
        assert got == b"", "answered a client without a certificate: %r" % got
    except (ssl.SSLError, ConnectionError):
        pass
    finally:
        s.close()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"QYRA\x01\x01" + b"\x00" * 50)
    try:
        got = s.recv(64)
    except ConnectionError:
        got = b""
    assert not got.startswith(b"QYRA"), "a plain Raft handshake was answered: %r" % got
    s.close()
    # The cluster still commits map changes (Raft over TLS).
    conn = connect(a)
    ch = conn.channel()
    ch.queue_declare("ctls-raft")
    ch.queue_delete("ctls-raft")
    conn.close()


@test(timeout=120)
def the_leader_killed_a_new_one_is_elected_over_tls():
    """kill -9 of the Raft leader: the survivors elect another over their
    TLS tunnels and commit; the killed broker restarts and catches up."""
    members()
    leader = wait_until(lambda: (cluster.leaders() or [None])[0], 20, what="a leader")
    leader.kill()
    others = [m for m in cluster.members if m is not leader]
    new = wait_until(lambda: (cluster.leaders(others) or [None])[0], 20, what="a new leader")
    conn = connect(others[0])
    ch = conn.channel()
    ch.queue_declare("ctls-after-kill")
    conn.close()
    leader.start()
    def commits_through_restarted():
        try:
            c = connect(leader)
            c.channel().queue_declare("ctls-after-kill", passive=True)
            c.close()
            return True
        except Exception:  # noqa: BLE001
            return False
    wait_until(commits_through_restarted, 30, what="the restarted broker back in the map")
    print("# %s killed, %s elected over TLS" % (leader.name, new.name))


if __name__ == "__main__":
    run(closer(lambda: cluster))
