#!/usr/bin/python3
"""32-tls: AMQPS, EXTERNAL logins, HTTPS and certificate reloads, with real clients.

Goal: a client reaches quay over TLS exactly as it would RabbitMQ on 5671
(pika.SSLOptions, amqp-tools' --ssl), logs in with a client certificate
(EXTERNAL, the user being the certificate's subject CN, as RabbitMQ's
rabbitmq_auth_mechanism_ssl does), and nothing a stranger sends to the TLS
port (garbage, plain AMQP, HTTP, a handshake it never finishes) does more
than close its own connection.

Method: the test makes a CA, a server certificate and client certificates
with the openssl command in a temporary directory. The broker under test
(one quayd, or in cluster mode the client's broker of a 3-broker cluster)
serves AMQPS with --tls-verify peer and a users file in which `app` exists
and `stranger` does not. Brokers of their own (always one quayd) check
--tls-verify require, HTTPS for the management API and SIGHUP reloads.
"""

import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
import warnings

import quaytest
from quaytest import (ACCESS_REFUSED, CONNECTION_START, SANITIZER_MARKERS, Broker, eq,
                      expect_close, expect_closed_socket, expect_method, free_port,
                      gen_connection_start_ok, handshake, make_tls_files, run, test, uniq,
                      wait_until)

QUAYD = os.environ.get("QUAYD", "")
TMP = tempfile.mkdtemp(prefix="quay-itest-tls-")
PKI = make_tls_files(os.path.join(TMP, "pki"), clients=("app", "stranger"))


def hash_password(pw):
    out = subprocess.run([QUAYD, "--hash-password", pw], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


USERS = os.path.join(TMP, "users")
with open(USERS, "w") as f:
    f.write("guest %s * loopback tags=administrator\n" % hash_password("guest"))
    f.write("app %s /\n" % hash_password("app-pw"))

TLS_PORT = free_port()


def tls_args(verify="peer", cert="server.pem", key="server.key"):
    return ["--tls-cert", PKI[cert], "--tls-key", PKI[key], "--tls-ca", PKI["ca.pem"],
            "--tls-verify", verify]


quaytest._broker = Broker(["--users", USERS], external_ok=False,
                          client_args=["--tls-listen", "127.0.0.1:%d" % TLS_PORT] + tls_args())
B = quaytest._broker


def client_context(cert=None, cafile=PKI["ca.pem"]):
    ctx = ssl.create_default_context(cafile=cafile)
    if cert:
        ctx.load_cert_chain(PKI[cert + ".pem"], PKI[cert + ".key"])
    return ctx


def tls_params(port=None, cert=None, credentials=None):
    import pika
    return pika.ConnectionParameters(
        "localhost", port or TLS_PORT, ssl_options=pika.SSLOptions(client_context(cert),
                                                                   "localhost"),
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=30)


def tls_connect(**kw):
    import pika
    c = pika.BlockingConnection(tls_params(**kw))
    quaytest._open_things.append(c)
    return c


def raw_tls(port=None, cert=None):
    """A TLS socket to the broker, for the raw frame helpers."""
    s = socket.create_connection(("127.0.0.1", port or TLS_PORT), timeout=5)
    t = client_context(cert).wrap_socket(s, server_hostname="localhost")
    quaytest._open_things.append(t)
    return t


@test
def pika_publishes_consumes_and_confirms_over_tls():
    c = tls_connect()
    ch = c.channel()
    ch.confirm_delivery()
    q = uniq("tls")
    ch.queue_declare(q, exclusive=True)
    bodies = [os.urandom(1024) for _ in range(300)] + [os.urandom(3 << 20), b""]
    for body in bodies:
        ch.basic_publish("", q, body)   # confirmed: raises if nacked
    got = []
    ch.basic_qos(prefetch_count=100)
    for method, _props, body in ch.consume(q, auto_ack=False, inactivity_timeout=10):
        assert body is not None, "timed out after %d deliveries" % len(got)
        got.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(got) == len(bodies):
            break
    ch.cancel()
    eq(len(got), len(bodies), "deliveries")
    assert got == bodies, "a body changed on its way through TLS"
    c.close()


@test(timeout=60)
def a_consumer_that_stops_reading_gets_everything_later():
    # Deliveries pile up beyond what the sockets hold: the broker's TLS
    # output waits for the socket (uv_write) and its output limits hold
    # the rest as plaintext, then everything arrives in order.
    c = tls_connect()
    ch = c.channel()
    q = uniq("slow")
    ch.queue_declare(q, exclusive=True)
    bodies = [(b"%06d" % i) * 700 for i in range(3000)]   # ~12.6 MB
    for body in bodies:
        ch.basic_publish("", q, body)
    got = []
    ch.basic_consume(q, lambda ch_, m, p, body: got.append(body), auto_ack=True)
    time.sleep(2)   # not reading: the broker fills the socket and waits
    wait_until(lambda: c.process_data_events(0.2) or len(got) == len(bodies), timeout=40,
               what="every delivery")
    assert got == bodies, "deliveries lost or reordered (%d of %d)" % (len(got), len(bodies))
    # Idle for over a second, the broker gives back the burst's TLS
    # buffers (conn_trim_idle); the connection goes on as before.
    time.sleep(1.6)
    ch.basic_publish("", q, b"after the pause")
    wait_until(lambda: c.process_data_events(0.1) or got[-1] == b"after the pause", timeout=10,
               what="a delivery after the trim")
    c.close()


@test
def connection_start_offers_external_on_tls_only():
    s = raw_tls()
    eq(handshake(s)["mechanisms"], ["PLAIN", "AMQPLAIN", "EXTERNAL"], "over TLS")
    s.close()
    s = quaytest.raw_socket()
    eq(handshake(s)["mechanisms"], ["PLAIN", "AMQPLAIN"], "plain TCP")
    s.close()


@test
def amqp_tools_publish_and_get_over_tls():
    c = tls_connect()
    q = uniq("tools")
    c.channel().queue_declare(q)
    url = "amqps://guest:guest@localhost:%d" % TLS_PORT
    tls = ["--ssl", "--cacert", PKI["ca.pem"], "--cert", PKI["app.pem"], "--key", PKI["app.key"]]
    p = subprocess.run(["amqp-publish", "--url", url] + tls + ["-r", q, "-b", "over tls"],
                       capture_output=True, text=True, timeout=30)
    eq(p.returncode, 0, "amqp-publish: " + p.stderr)
    p = subprocess.run(["amqp-get", "--url", url] + tls + ["-q", q], capture_output=True,
                       timeout=30)
    eq(p.returncode, 0, "amqp-get: %r" % p.stderr)
    eq(p.stdout, b"over tls", "amqp-get's body")
    c.channel().queue_delete(q)
    c.close()


@test
def external_login_uses_the_certificate_cn():
    import pika
    c = tls_connect(cert="app", credentials=pika.credentials.ExternalCredentials())
    ch = c.channel()
    q = uniq("ext")
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"by certificate")
    eq(ch.basic_get(q, auto_ack=True)[2], b"by certificate", "app's message")
    c.close()


REFUSED = ("ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL. "
           "For details see the broker logfile.")


def external_refused(cert, port=None):
    """EXTERNAL over a raw TLS socket: RabbitMQ's 403 and its wording."""
    s = raw_tls(port=port, cert=cert)
    s.sendall(quaytest.PROTOCOL_HEADER)
    expect_method(s, *CONNECTION_START)
    s.sendall(gen_connection_start_ok(mechanism="EXTERNAL", response=b""))
    code, text, _, _ = expect_close(s, connection=True)
    eq((code, text), (ACCESS_REFUSED, REFUSED), "EXTERNAL with %s" % cert)
    expect_closed_socket(s)


@test
def external_is_refused_for_an_unknown_user_or_without_a_certificate():
    external_refused("stranger")   # verified, but no such user
    external_refused(None)         # --tls-verify peer: no certificate, in, but not by EXTERNAL
    # pika's view of the same refusal.
    import pika
    try:
        tls_connect(cert="stranger", credentials=pika.credentials.ExternalCredentials())
        raise AssertionError("stranger logged in")
    except pika.exceptions.ProbableAccessDeniedError:
        pass
    except pika.exceptions.AMQPConnectionError as e:
        assert "403" in repr(e) or "ACCESS_REFUSED" in repr(e), repr(e)


@test
def a_plain_password_still_works_with_a_certificate():
    import pika
    c = tls_connect(cert="stranger", credentials=pika.PlainCredentials("app", "app-pw"))
    c.channel().queue_declare(uniq("pw"), exclusive=True)
    c.close()


@test(timeout=60)
def strangers_on_the_tls_port_are_closed():
    payloads = [b"GET / HTTP/1.0\r\n\r\n", quaytest.PROTOCOL_HEADER, os.urandom(100000),
                b"\x16\x03\x01\x00\x05hello", b"\x16\x03\x01\xff\xff" + os.urandom(300)]
    for payload in payloads[:4]:
        s = socket.create_connection(("127.0.0.1", TLS_PORT), timeout=5)
        try:
            s.sendall(payload)
        except OSError:
            pass
        expect_closed_socket(s, timeout=5)
        s.close()
    # A handshake that never finishes (a record announced, never sent;
    # a client that says nothing) ends at the handshake timeout.
    stalled = []
    for payload in (payloads[4], b""):
        s = socket.create_connection(("127.0.0.1", TLS_PORT), timeout=5)
        s.sendall(payload)
        stalled.append(s)
    for s in stalled:
        expect_closed_socket(s, timeout=20)
        s.close()
    # A client that leaves in the middle of a handshake.
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", TLS_PORT), timeout=5)
        outgoing = ssl.MemoryBIO()
        obj = client_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        s.sendall(outgoing.read())   # the ClientHello, then gone
        s.close()
    # Garbage after a finished handshake (a record that does not decrypt),
    # in the middle of an AMQP session.
    for garbage in (os.urandom(2000), b"\x17\x03\x03\x40\x00" + os.urandom(16384 + 200)):
        s = socket.create_connection(("127.0.0.1", TLS_PORT), timeout=5)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = client_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                s.sendall(outgoing.read())
                incoming.write(s.recv(65536))
        obj.write(quaytest.PROTOCOL_HEADER)
        s.sendall(outgoing.read() + garbage)
        expect_closed_socket(s, timeout=5)
        s.close()
    # A TLS 1.1 client is refused in the handshake (TLS 1.2 at least).
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(PKI["ca.pem"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the point of the test
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("ALL:@SECLEVEL=0")
        ctx.wrap_socket(socket.create_connection(("127.0.0.1", TLS_PORT), timeout=5),
                        server_hostname="localhost").close()
        raise AssertionError("a TLS 1.1 handshake succeeded")
    except (ssl.SSLError, OSError):
        pass
    c = tls_connect()
    c.channel()
    c.close()


# ---- brokers of their own: --tls-verify require, HTTPS, SIGHUP -------------

class OwnBroker:
    """One quayd with the arguments given, its log in its directory."""

    def __init__(self, args):
        self.dir = tempfile.mkdtemp(prefix="quay-itest-tls-own-")
        self.amqp_port = free_port()
        self.log_path = os.path.join(self.dir, "log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [QUAYD, "--listen", "127.0.0.1:%d" % self.amqp_port, "--data",
                 os.path.join(self.dir, "data"), "--users", USERS, "--log-level", "info"] + args,
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        quaytest.wait_accepting(self.proc, "127.0.0.1", self.amqp_port, 20, self.log)

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(10)
        text = self.log()
        eq(rc, 0, "exit status; log:\n" + text[-3000:])
        for marker in SANITIZER_MARKERS:
            assert marker not in text, text


def can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@test(timeout=60)
def require_refuses_a_handshake_without_a_certificate():
    import pika
    port = free_port()
    b = OwnBroker(["--tls-listen", "127.0.0.1:%d" % port] + tls_args("require"))
    try:
        wait_until(lambda: can_connect(port), what="the AMQPS listener")
        try:
            s = raw_tls(port=port)
            # TLS 1.3: the refusal arrives after the client's handshake ends.
            handshake(s)
            raise AssertionError("a client without a certificate got in")
        except (ssl.SSLError, OSError, quaytest.ProtocolError):
            pass
        c = tls_connect(port=port, cert="app",
                        credentials=pika.credentials.ExternalCredentials())
        c.channel().queue_declare(uniq("req"), exclusive=True)
        c.close()
        external_refused("stranger", port)
        wait_until(lambda: "EXTERNAL login refused: user 'stranger' - invalid credentials"
                   in b.log(), what="the refusal's reason in the log")
        assert "user 'app' logged in with EXTERNAL" in b.log(), b.log()
    finally:
        b.stop()


def https_get(port, path, cafile=PKI["ca.pem"], host="localhost"):
    req = urllib.request.Request("https://%s:%d%s" % (host, port, path))
    req.add_header("Authorization", quaytest.api_authorization("guest", "guest"))
    ctx = ssl.create_default_context(cafile=cafile)
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return r.status, r.read()


@test(timeout=60)
def https_serves_the_management_api():
    port = free_port()
    b = OwnBroker(["--https", "127.0.0.1:%d" % port] + tls_args("none")[:6])
    try:
        wait_until(lambda: can_connect(port), what="the HTTPS listener")
        status, body = https_get(port, "/api/overview")
        eq(status, 200, "GET /api/overview over HTTPS")
        assert b"quay" in body or b"{" in body, body
        # Plain HTTP to the HTTPS port is closed, not answered.
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /api/overview HTTP/1.0\r\nHost: localhost\r\n\r\n")
        eq(expect_closed_socket(s), b"", "plain HTTP's answer")
        s.close()
        # A client that never finishes its handshake is cut (the API's 5 s).
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"\x16\x03\x01\x02\x00\x01")
        expect_closed_socket(s, timeout=15)
        s.close()
        # quayctl over HTTPS.
        ctl = os.path.join(os.path.dirname(QUAYD), "quayctl")
        p = subprocess.run([ctl, "--https", "localhost:%d" % port, "--cacert", PKI["ca.pem"],
                            "status"], capture_output=True, text=True, timeout=30)
        eq(p.returncode, 0, "quayctl --https: " + p.stderr)
        p = subprocess.run([ctl, "--https", "localhost:%d" % port, "status"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, "quayctl trusted a certificate without --cacert"
    finally:
        b.stop()
    # Over TLS the API may listen beyond loopback without --http-allow-plaintext.
    port = free_port()
    b = OwnBroker(["--https", "0.0.0.0:%d" % port] + tls_args("none")[:6])
    try:
        wait_until(lambda: can_connect(port), what="the HTTPS listener on 0.0.0.0")
        eq(https_get(port, "/api/overview")[0], 200, "HTTPS on 0.0.0.0")
    finally:
        b.stop()


def server_certificate(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with ctx.wrap_socket(s, server_hostname="localhost") as t:
        return t.getpeercert(binary_form=True)


@test(timeout=90)
def sighup_reloads_certificates_for_new_connections():
    d = tempfile.mkdtemp(prefix="quay-itest-tls-reload-")
    new = make_tls_files(os.path.join(d, "new"), clients=("app",))
    live = {n: os.path.join(d, n) for n in ("server.pem", "server.key", "ca.pem")}
    for n in live:
        with open(PKI[n], "rb") as src, open(live[n], "wb") as dst:
            dst.write(src.read())
    port = free_port()
    b = OwnBroker(["--tls-listen", "127.0.0.1:%d" % port, "--tls-cert", live["server.pem"],
                   "--tls-key", live["server.key"], "--tls-ca", live["ca.pem"],
                   "--tls-verify", "peer"])
    try:
        wait_until(lambda: can_connect(port), what="the AMQPS listener")
        before = server_certificate(port)
        old = tls_connect(port=port)
        ch = old.channel()
        # A broken file: the reload fails, the old certificate stays.
        with open(live["server.key"], "w") as f:
            f.write("not a key\n")
        b.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "previous certificates stay in use" in b.log(), what="the failure")
        eq(server_certificate(port), before, "after a failed reload")
        for n in live:
            with open(new[n], "rb") as src, open(live[n], "wb") as dst:
                dst.write(src.read())
        b.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "TLS certificates reloaded" in b.log(), what="the reload")
        after = server_certificate(port)
        assert after != before, "the new certificate is not served"
        # The open connection goes on with its session; new clients trust the new CA.
        q = uniq("reload")
        ch.queue_declare(q, exclusive=True)
        ch.basic_publish("", q, b"still here")
        eq(ch.basic_get(q, auto_ack=True)[2], b"still here", "the old connection")
        old.close()
        import pika
        params = tls_params(port=port)
        params.ssl_options = pika.SSLOptions(ssl.create_default_context(cafile=new["ca.pem"]),
                                             "localhost")
        c = pika.BlockingConnection(params)
        c.channel()
        c.close()
    finally:
        b.stop()


if __name__ == "__main__":
    run()
