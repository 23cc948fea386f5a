"""01-connection: connection/channel lifecycle and hard protocol errors.

Goal: the broker's connection layer (protocol header, SASL login, tune,
heartbeats, open/close in both directions, channel bookkeeping, framing
errors) behaves exactly like RabbitMQ 3.10.

Method: raw sockets driven by quaytest's own AMQP encoder, so malformed and
out-of-order frames can be sent.  Every expectation (reply code, reply text,
class/method ids, whether a close frame is sent at all, who closes the
socket) was observed on RabbitMQ 3.10.8; see RABBITMQ-NOTES.md.  After every
test the runner checks that a fresh connection still works.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quaytest import *  # noqa: E402,F401,F403


def start_ok_only(**kw):
    """Socket that has sent the header and received connection.start."""
    s = raw_socket()
    s.sendall(PROTOCOL_HEADER)
    expect_method(s, *CONNECTION_START)
    return s


def until_tune(**kw):
    s = start_ok_only()
    s.sendall(gen_connection_start_ok(**kw))
    expect_method(s, *CONNECTION_TUNE)
    return s


def assert_silent_close(s, timeout=10):
    """The server closes the TCP connection without sending any frame.
    (RabbitMQ waits ~3 s before doing so: its SILENT_CLOSE_DELAY.)"""
    got = expect_closed_socket(s, timeout)
    eq(got, b"", "bytes received before the silent close")


# ---------------------------------------------------------------- handshake

@test
def handshake_and_server_properties():
    s = raw_socket()
    info = handshake(s)
    eq(info["version"], (0, 9), "connection.start version")
    for mech in ("PLAIN", "AMQPLAIN"):
        assert mech in info["mechanisms"], info["mechanisms"]
    # Only a clustered quay offers its peers' login (18-cluster-login).
    assert "QUAY-CLUSTER" not in info["mechanisms"], info["mechanisms"]
    eq(info["locales"], ["en_US"], "locales")
    props = info["server_properties"]
    assert "quay_nonce" not in props, props
    for key in ("product", "version", "platform"):
        assert isinstance(props.get(key), str) and props[key], (key, props)
    caps = props["capabilities"]
    for cap in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "connection.blocked",
                "authentication_failure_close", "per_consumer_qos"):
        eq(caps.get(cap), True, "capability " + cap)
    # RabbitMQ 3.10 defaults: channel_max 2047, frame_max 131072, heartbeat 60
    eq(info["tune"], (2047, 131072, 60), "connection.tune (channel_max, frame_max, heartbeat)")
    s.sendall(gen_connection_close())
    expect_method(s, *CONNECTION_CLOSE_OK)


@test
def bad_protocol_headers_get_our_header_then_close():
    for hdr in (b"AMQP\x00\x00\x09\x00", b"HTTP/1.1 200 OK\r\n\r\n", b"AMQP\x00\x00\x08\x00",
                b"AMQP\x00\x01\x00\x00", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
        s = raw_socket()
        s.sendall(hdr)
        got = expect_closed_socket(s)
        eq(got, b"AMQP\x00\x00\x09\x01", "reply to header %r" % hdr)


@test
def incomplete_header_times_out_after_handshake_timeout():
    # RabbitMQ: handshake_timeout = 10 s; the socket is closed silently.
    s = raw_socket()
    s.sendall(b"AMQ")
    t0 = time.time()
    eq(expect_closed_socket(s, 15), b"", "bytes before close")
    assert time.time() - t0 > 5, "closed too early"


@test
def bad_password_with_auth_failure_close_gets_403():
    s = start_ok_only()
    s.sendall(gen_connection_start_ok("guest", "wrong"))
    close = expect_close(s, connection=True)
    eq(close, (ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused using authentication "
               "mechanism PLAIN. For details see the broker logfile.", 0, 0))
    expect_closed_socket(s)


@test
def unknown_user_gets_the_same_403():
    s = start_ok_only()
    s.sendall(gen_connection_start_ok("no-such-user", "guest"))
    close = expect_close(s, connection=True)
    eq(close, (ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused using authentication "
               "mechanism PLAIN. For details see the broker logfile.", 0, 0))
    expect_closed_socket(s)


@test
def bad_password_without_capability_is_silent_close():
    s = start_ok_only()
    s.sendall(gen_connection_start_ok("guest", "wrong", capabilities={}))
    assert_silent_close(s)


@test
def unknown_mechanism_is_silent_close():
    s = start_ok_only()
    s.sendall(gen_connection_start_ok(mechanism="FOO", response=b"x"))
    assert_silent_close(s)


@test
def amqplain_login():
    s = raw_socket()
    handshake(s, mechanism="AMQPLAIN")
    s.sendall(gen_connection_close())
    expect_method(s, *CONNECTION_CLOSE_OK)
    s = start_ok_only()
    s.sendall(gen_connection_start_ok("guest", "bad", mechanism="AMQPLAIN"))
    close = expect_close(s, connection=True)
    eq(close, (ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused using authentication "
               "mechanism AMQPLAIN. For details see the broker logfile.", 0, 0))


@test
def unknown_vhost_gets_530():
    s = until_tune()
    s.sendall(gen_tune_ok())
    s.sendall(gen_open("/no-such-vhost"))
    close = expect_close(s, connection=True)
    eq(close, (NOT_ALLOWED, "NOT_ALLOWED - vhost /no-such-vhost not found", 10, 40))
    expect_closed_socket(s)


# --------------------------------------------------------------------- tune

@test
def smaller_client_frame_max_is_used_both_ways():
    s = raw_connection(frame_max=4096)
    q = uniq("fm")
    s.sendall(gen_queue_declare(1, q, exclusive=True))
    expect_method(s, *QUEUE_DECLARE_OK)
    body = bytes(range(256)) * 40  # 10240 bytes -> 3 body frames of <= 4088
    s.sendall(gen_publish(1, "", q, body, frame_max=4096))
    # A frame of exactly frame_max octets (7 + 4088 + 1) is legal.
    s.sendall(gen_publish(1, "", q, b"y" * 4088, frame_max=4096))
    for expected in (body, b"y" * 4088):
        s.sendall(gen_basic_get(1, q, no_ack=True))
        expect_method(s, *BASIC_GET_OK)
        ftype, ch, payload = read_frame(s)
        eq(ftype, FRAME_HEADER)
        got = b""
        while len(got) < len(expected):
            ftype, ch, chunk = read_frame(s)
            eq(ftype, FRAME_BODY)
            assert 8 + len(chunk) <= 4096, "server body frame exceeds frame_max"
            got += chunk
        eq(got, expected, "body")


@test
def out_of_range_tune_ok_is_silent_close():
    # frame_max must be in [4096, 131072] (0 = "unlimited" is above the max);
    # channel_max must be in [1, 2047] (0 = "unlimited" is above the max).
    # RabbitMQ closes without a frame ~3 s later.  Run the cases in parallel.
    socks = []
    for cm, fm in ((2047, 4095), (2047, 1000), (2047, 0), (2047, 131073),
                   (2048, 131072), (0, 131072)):
        s = until_tune()
        s.sendall(gen_tune_ok(channel_max=cm, frame_max=fm))
        socks.append(s)
    for s in socks:
        assert_silent_close(s)


@test
def boundary_tune_values_are_accepted():
    for cm, fm in ((2047, 4096), (1, 131072)):
        s = raw_connection(channel=None, channel_max=cm, frame_max=fm)
        s.sendall(gen_connection_close())
        expect_method(s, *CONNECTION_CLOSE_OK)


@test
def channel_numbers_above_channel_max_are_refused():
    # RabbitMQ 3.10 does not check the channel *number* against channel_max
    # (channel 65535 opens fine); it limits the number of open channels.
    # quay applies the spec's rule instead (connection.tune: usable channel
    # numbers are 1..channel-max), so that a client cannot make the
    # broker's table of channels as large as the highest number: a frame on
    # a higher channel is a hard 504 (RABBITMQ-NOTES.md section 2).
    s = raw_connection(channel=None, channel_max=3)
    if is_rabbitmq():
        for ch in (1, 65535, 7):
            s.sendall(gen_channel_open(ch))
            expect_method(s, *CHANNEL_OPEN_OK, channel=ch)
        s.sendall(gen_channel_open(8))
        close = expect_close(s, connection=True)
        eq(close, (NOT_ALLOWED, "NOT_ALLOWED - number of channels opened (3) has reached the "
                   "negotiated channel_max (3)", 0, 0))
        expect_closed_socket(s)
        return
    for ch in (1, 3, 2):
        s.sendall(gen_channel_open(ch))
        expect_method(s, *CHANNEL_OPEN_OK, channel=ch)
    for ch, frame_ in ((4, gen_channel_open(4)), (65535, gen_queue_declare(65535, "q"))):
        s.sendall(frame_)
        eq(expect_close(s, connection=True),
           (CHANNEL_ERROR, "CHANNEL_ERROR - channel %d is above the negotiated channel_max (3)"
            % ch, 0, 0))
        expect_closed_socket(s)
        s = raw_connection(channel=None, channel_max=3)


# --------------------------------------------------------------- heartbeats

@test
def heartbeat_sent_by_server_and_silence_closes():
    # heartbeat=1: RabbitMQ sends a heartbeat every 0.5 s (interval/2) and
    # drops the TCP connection (no connection.close) after ~3 s of silence
    # from the client (3 s for heartbeat=1, 6 s for heartbeat=2).
    s = raw_connection(channel=None, heartbeat=1)
    t0 = time.time()
    n_heartbeats = 0
    while True:
        try:
            ftype, ch, payload = read_frame(s, 10)
        except ProtocolError as e:
            assert "closed" in str(e), e
            break
        except (ConnectionResetError, BrokenPipeError):
            break
        eq((ftype, ch, payload), (FRAME_HEARTBEAT, 0, b""), "only heartbeats expected")
        n_heartbeats += 1
    elapsed = time.time() - t0
    assert n_heartbeats >= 2, "server sent %d heartbeats" % n_heartbeats
    assert 1.5 <= elapsed <= 8, "closed after %.1f s" % elapsed


@test
def heartbeats_from_client_keep_connection_alive():
    s = raw_connection(channel=None, heartbeat=1)
    t0 = time.time()
    while time.time() - t0 < 5:
        s.sendall(gen_heartbeat())
        assert_no_frame(s, 0.4)   # heartbeats are skipped, anything else fails
    s.sendall(gen_connection_close())
    expect_method(s, *CONNECTION_CLOSE_OK)


@test
def no_heartbeats_when_client_says_zero():
    s = raw_connection(channel=None, heartbeat=0)
    s.settimeout(2.5)
    try:
        data = s.recv(100)
        raise AssertionError("unexpected data with heartbeat=0: %r" % data)
    except OSError:
        pass


# ------------------------------------------------------------------- close

@test
def client_initiated_close():
    s = raw_connection()
    s.sendall(gen_connection_close(200, "bye"))
    expect_method(s, *CONNECTION_CLOSE_OK, channel=0)
    # RabbitMQ leaves closing the TCP socket to the client after close-ok;
    # nothing else is sent.
    assert_no_frame(s, 0.3)


@test
def server_initiated_close_then_close_ok_closes_socket():
    s = raw_connection()
    s.sendall(gen_channel_open(1))
    close = expect_close(s, connection=True, send_close_ok=False)
    eq(close, (CHANNEL_ERROR, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10))
    # Frames other than close/close-ok are ignored after the server's close.
    s.sendall(gen_channel_open(2))
    assert_no_frame(s, 0.3)
    s.sendall(gen_connection_close_ok())
    expect_closed_socket(s)


@test
def channel_close_and_reopen():
    s = raw_connection()
    s.sendall(gen_channel_close(1))
    expect_method(s, *CHANNEL_CLOSE_OK, channel=1)
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)


@test
def frames_ignored_on_channel_until_close_ok():
    s = raw_connection()
    s.sendall(gen_queue_declare(1, "amq.reserved"))
    close = expect_close(s, connection=False, send_close_ok=False)
    eq(close, (ACCESS_REFUSED, "ACCESS_REFUSED - queue name 'amq.reserved' contains "
               "reserved prefix 'amq.*'", 50, 10))
    s.sendall(gen_queue_declare(1, ""))     # dropped: channel is closing
    assert_no_frame(s, 0.3)
    s.sendall(gen_channel_close_ok(1))
    s.sendall(gen_channel_open(1))
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)


@test
def unsolicited_connection_close_ok_is_504():
    s = raw_connection()
    s.sendall(gen_connection_close_ok())
    eq(expect_close(s, connection=True),
       (CHANNEL_ERROR, "CHANNEL_ERROR - unexpected method in connection state running", 10, 51))
    expect_closed_socket(s)


@test
def unsolicited_channel_close_ok_is_503():
    s = raw_connection()
    s.sendall(gen_channel_close_ok(1))
    eq(expect_close(s, connection=True),
       (COMMAND_INVALID, "COMMAND_INVALID - unimplemented method", 20, 41))
    expect_closed_socket(s)


# ------------------------------------------------------- channel misuse

@test
def channel_open_twice_is_504():
    s = raw_connection()
    s.sendall(gen_channel_open(1))
    eq(expect_close(s, connection=True),
       (CHANNEL_ERROR, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10))
    expect_closed_socket(s)


@test
def method_on_unopened_channel_is_504():
    s = raw_connection()
    s.sendall(gen_queue_declare(2, ""))
    eq(expect_close(s, connection=True),
       (CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", 50, 10))
    expect_closed_socket(s)
    s = raw_connection()
    s.sendall(gen_channel_close(5))
    eq(expect_close(s, connection=True),
       (CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'", 20, 40))


@test
def non_connection_method_on_channel_zero_is_504():
    for frame_bytes, ids in ((gen_queue_declare(0, ""), (50, 10)),
                             (gen_channel_open(0), (20, 10))):
        s = raw_connection()
        s.sendall(frame_bytes)
        eq(expect_close(s, connection=True),
           (CHANNEL_ERROR, "CHANNEL_ERROR - unexpected method in connection state running")
           + ids)
        expect_closed_socket(s)


@test
def connection_method_on_channel_is_503():
    s = raw_connection()
    s.sendall(gen_method(1, 10, 40, shortstr("/") + shortstr("") + bits(False)))
    eq(expect_close(s, connection=True),
       (COMMAND_INVALID, "COMMAND_INVALID - unimplemented method", 10, 40))
    expect_closed_socket(s)


# ---------------------------------------------------------- framing errors

@test
def bad_frame_end_is_501():
    s = raw_connection()
    s.sendall(gen_queue_declare(1, "")[:-1] + b"\x00")
    code, text, cls, mth = expect_close(s, connection=True)
    eq((code, cls, mth), (FRAME_ERROR, 0, 0))
    # RabbitMQ: "FRAME_ERROR - type 1, all octets = <<...>>: {invalid_frame_end_marker, 0}"
    assert text.startswith("FRAME_ERROR - type 1, all octets = "), text
    assert "invalid_frame_end_marker" in text, text
    # RabbitMQ ignores our close-ok here and drops the socket ~3 s later.
    expect_closed_socket(s, 10)


@test
def frame_larger_than_frame_max_is_501():
    s = raw_connection(frame_max=4096)
    s.sendall(gen_basic_publish(1, "", "x") + gen_content_header(1, 5000)
              + gen_body(1, b"a" * 5000))
    code, text, cls, mth = expect_close(s, connection=True)
    eq((code, cls, mth), (FRAME_ERROR, 0, 0))
    # RabbitMQ: "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,5000,4088}"
    assert text.startswith("FRAME_ERROR - type 3"), text
    assert "frame_too_large,5000,4088" in text, text
    expect_closed_socket(s, 10)


@test
def unknown_frame_type_is_501():
    s = raw_connection()
    s.sendall(frame(7, 1, b"abc"))
    eq(expect_close(s, connection=True),
       (FRAME_ERROR, 'FRAME_ERROR - type 7, all octets = <<"abc">>: unknown_frame', 0, 0))
    expect_closed_socket(s, 10)


@test
def method_frame_too_short_for_ids_is_501():
    s = raw_connection()
    s.sendall(frame(FRAME_METHOD, 1, b"\x00"))
    eq(expect_close(s, connection=True),
       (FRAME_ERROR, "FRAME_ERROR - type 1, all octets = <<0>>: unknown_frame", 0, 0))
    expect_closed_socket(s, 10)


@test
def unknown_class_or_method_drops_connection():
    # RabbitMQ 3.10 does NOT send connection.close 540 here: the decoder
    # crashes the connection process ({unknown_method_id,{99,10}}) and the
    # TCP connection is dropped without any frame.  We accept exactly that,
    # or (more polite, same client-visible outcome) connection.close 540.
    for ch, cls, mth in ((1, 99, 10), (1, 60, 99), (0, 99, 10), (0, 10, 99)):
        s = raw_connection()
        s.sendall(gen_method(ch, cls, mth))
        try:
            ftype, _, payload = read_frame(s, 10)
        except (ProtocolError, ConnectionResetError) as e:
            assert "closed" in str(e) or isinstance(e, ConnectionResetError), e
            continue
        m = Method(0, payload)
        eq((ftype, m.id), (FRAME_METHOD, CONNECTION_CLOSE), "only a 540 close is tolerated")
        eq(decode_close(m)[0], NOT_IMPLEMENTED)
        s.sendall(gen_connection_close_ok())
        expect_closed_socket(s)


@test
def quay_peer_methods_are_unknown_to_clients():
    """queue.quay-counts (50.200) is quay's own, for peer brokers: from a
    client it is an unknown method (540), whether or not the queue exists,
    and no counts are answered."""
    if is_rabbitmq():
        return
    for existing in (True, False):
        s = raw_connection()
        q = declare_queue(s)[0] if existing else uniq("no-such")
        s.sendall(gen_method(1, 50, 200, shortstr(q)))
        eq(expect_close(s, connection=True),
           (NOT_IMPLEMENTED, "NOT_IMPLEMENTED - unknown method 50.200", 50, 200))
        expect_closed_socket(s)


@test
def truncated_method_arguments_are_501():
    # Note: 501 FRAME_ERROR (not 502 SYNTAX_ERROR), and class/method are set.
    s = raw_connection()
    s.sendall(gen_method(1, 50, 10, short(0) + b"\x05ab"))
    eq(expect_close(s, connection=True),
       (FRAME_ERROR, "FRAME_ERROR - cannot decode <<0,0,5,97,98>>", 50, 10))
    expect_closed_socket(s)
    s = raw_connection()
    s.sendall(gen_method(1, 60, 40, short(0)))
    eq(expect_close(s, connection=True),
       (FRAME_ERROR, "FRAME_ERROR - cannot decode <<0,0>>", 60, 40))
    expect_closed_socket(s)


@test
def content_body_without_publish_is_505():
    for bad in (gen_body(1, b"hello"), gen_content_header(1, 5)):
        s = raw_connection()
        s.sendall(bad)
        eq(expect_close(s, connection=True),
           (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - expected method frame, got non method "
            "frame instead", 0, 0))
        expect_closed_socket(s)


@test
def body_after_zero_size_header_is_505():
    s = raw_connection()
    s.sendall(gen_basic_publish(1, "", "x") + gen_content_header(1, 0) + gen_body(1, b"x"))
    eq(expect_close(s, connection=True),
       (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - expected method frame, got non method "
        "frame instead", 0, 0))


@test
def method_where_content_header_expected_is_505():
    s = raw_connection()
    s.sendall(gen_basic_publish(1, "", "x") + gen_queue_declare(1, ""))
    eq(expect_close(s, connection=True),
       (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - expected content header for class 60, got non "
        "content header frame instead", 60, 40))
    expect_closed_socket(s)


@test
def method_where_content_body_expected_is_505():
    s = raw_connection()
    s.sendall(gen_basic_publish(1, "", "x") + gen_content_header(1, 5) + gen_queue_declare(1, ""))
    eq(expect_close(s, connection=True),
       (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - expected content body, got non content body "
        "frame instead", 60, 40))
    expect_closed_socket(s)


@test
def content_header_for_wrong_class_is_505():
    s = raw_connection()
    s.sendall(gen_basic_publish(1, "", "x")
              + frame(FRAME_HEADER, 1, short(50) + short(0) + longlong(0) + short(0)))
    eq(expect_close(s, connection=True),
       (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - expected content header for class 60, got one "
        "for class 50 instead", 60, 40))


@test
def heartbeat_on_nonzero_channel_and_body_on_channel_zero_are_505():
    s = raw_connection()
    s.sendall(frame(FRAME_HEARTBEAT, 1, b""))
    eq(expect_close(s, connection=True),
       (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0))
    s = raw_connection()
    s.sendall(gen_body(0, b"x"))
    eq(expect_close(s, connection=True),
       (UNEXPECTED_FRAME, 'UNEXPECTED_FRAME - type 3, all octets = <<"x">>', 0, 0))


@test
def crossing_channel_closes_keep_the_connection():
    """The client closes a channel while the broker closes it for an error:
    each close is the other's close-ok (spec 1.5.2.5); a close-ok the client
    sends for ours anyway is ignored, as RabbitMQ does (amqp091-go tests
    this), and the connection's other channels go on. A close-ok for a
    channel that was never closing is still a connection error."""
    s = raw_connection()
    s.sendall(gen_channel_open(2))
    expect_method(s, *CHANNEL_OPEN_OK, channel=2)
    s.sendall(gen_basic_get(1, uniq("nowhere")) + gen_channel_close(1))
    close = expect_method(s, *CHANNEL_CLOSE, channel=1)
    eq(close.args.short(), NOT_FOUND, "the broker's close")
    expect_method(s, *CHANNEL_CLOSE_OK, channel=1)   # the answer to ours
    s.sendall(gen_channel_close_ok(1))              # and ours to its: ignored
    assert_no_frame(s, 0.3)
    eq(declare_queue(s, 2)[1:], (0, 0), "channel 2 still works")
    s.sendall(gen_channel_open(1))                  # the id is free again
    expect_method(s, *CHANNEL_OPEN_OK, channel=1)
    # Once only: a second close-ok is a stray frame.
    s.sendall(gen_channel_close(1))
    expect_method(s, *CHANNEL_CLOSE_OK, channel=1)
    s.sendall(gen_channel_close_ok(1))
    eq(expect_close(s, connection=True)[:2], (CHANNEL_ERROR, "CHANNEL_ERROR - expected "
                                              "'channel.open'"), "stray close-ok")


if __name__ == "__main__":
    run()
