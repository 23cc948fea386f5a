#!/usr/bin/python3
"""make_corpus.py: writes the seed corpus for the fuzz harnesses.

Each harness gets a few valid inputs under tests/fuzz/corpus/<name>/, built
here with an encoder independent of the C codec (struct.pack). The files are
committed; rerun this script after changing it. Deterministic output.
"""
import base64
import hashlib
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def shortstr(s):
    b = s.encode()
    return struct.pack(">B", len(b)) + b


def longstr(s):
    b = s if isinstance(s, bytes) else s.encode()
    return struct.pack(">I", len(b)) + b


def table(entries):
    """entries: list of (key, raw typed value bytes)."""
    body = b"".join(shortstr(k) + v for k, v in entries)
    return body


SAMPLE_TABLE = table([
    ("product", b"S" + longstr("quay")),
    ("capabilities", b"F" + longstr(table([("publisher_confirms", b"t\x01"),
                                            ("basic.nack", b"t\x01")]))),
    ("x-max-length", b"l" + struct.pack(">q", 1000)),
    ("x-death", b"A" + longstr(b"F" + longstr(table([
        ("count", b"l" + struct.pack(">q", 1)),
        ("reason", b"S" + longstr("rejected")),
        ("time", b"T" + struct.pack(">Q", 1700000000)),
        ("routing-keys", b"A" + longstr(b"S" + longstr("rk")))])))),
    ("misc", b"F" + longstr(table([
        ("b", b"b\xff"), ("B", b"B\x01"), ("s", b"s\xff\xfe"), ("u", b"u\x00\x02"),
        ("I", b"I\x00\x00\x00\x03"), ("i", b"i\x00\x00\x00\x04"),
        ("f", b"f" + struct.pack(">f", 1.5)), ("d", b"d" + struct.pack(">d", 2.5)),
        ("D", b"D\x02\x00\x00\x30\x39"), ("x", b"x" + longstr(b"\x00\x01")), ("V", b"V")]))),
])


def method(class_id, method_id, args=b""):
    return struct.pack(">HH", class_id, method_id) + args


METHODS = {
    "connection_start": method(10, 10, b"\x00\x09" + longstr(SAMPLE_TABLE) + longstr("PLAIN")
                               + longstr("en_US")),
    "connection_start_ok": method(10, 11, longstr(table([("product", b"S" + longstr("x"))]))
                                  + shortstr("PLAIN") + longstr(b"\x00guest\x00guest")
                                  + shortstr("en_US")),
    "connection_tune": method(10, 30, struct.pack(">HIH", 2047, 131072, 60)),
    "connection_open": method(10, 40, shortstr("/") + shortstr("") + b"\x00"),
    "connection_close": method(10, 50, struct.pack(">H", 320) + shortstr("CONNECTION_FORCED")
                               + struct.pack(">HH", 0, 0)),
    "channel_open": method(20, 10, shortstr("")),
    "exchange_declare": method(40, 10, b"\x00\x00" + shortstr("ex") + shortstr("topic")
                               + b"\x1e" + longstr(b"")),
    "queue_declare": method(50, 10, b"\x00\x00" + shortstr("orders") + b"\x02"
                            + longstr(SAMPLE_TABLE)),
    "queue_bind": method(50, 20, b"\x00\x00" + shortstr("q") + shortstr("amq.topic")
                         + shortstr("a.*.c") + b"\x00" + longstr(b"")),
    "basic_qos": method(60, 10, struct.pack(">IH", 0, 10) + b"\x00"),
    "basic_consume": method(60, 20, b"\x00\x00" + shortstr("q") + shortstr("ctag") + b"\x05"
                            + longstr(b"")),
    "basic_publish": method(60, 40, b"\x00\x00" + shortstr("amq.direct") + shortstr("rk")
                            + b"\x01"),
    "basic_deliver": method(60, 60, shortstr("ctag") + struct.pack(">Q", 7) + b"\x01"
                            + shortstr("ex") + shortstr("rk")),
    "basic_ack": method(60, 80, struct.pack(">Q", 7) + b"\x01"),
    "basic_nack": method(60, 120, struct.pack(">Q", 7) + b"\x03"),
    "confirm_select": method(85, 10, b"\x00"),
    "tx_commit": method(90, 20),
}

PROPS_ALL = (struct.pack(">H", 0xFFFC) + shortstr("application/json") + shortstr("gzip")
             + longstr(SAMPLE_TABLE) + b"\x02\x05" + shortstr("corr") + shortstr("reply")
             + shortstr("60000") + shortstr("id-1") + struct.pack(">Q", 1700000000)
             + shortstr("type") + shortstr("guest") + shortstr("app") + shortstr("c1"))
PROPS = {
    "all": PROPS_ALL,
    "none": struct.pack(">H", 0),
    "persistent": struct.pack(">H", 0x1000) + b"\x02",
    "headers": struct.pack(">H", 0x2000) + longstr(SAMPLE_TABLE),
}


def frame(ftype, channel, payload):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def content_header(body_size, props):
    return struct.pack(">HHQ", 60, 0, body_size) + props


def write(name, files):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for fname, data in sorted(files.items()):
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)


def main():
    write("fuzz_method", METHODS)
    write("fuzz_table", {"sample": SAMPLE_TABLE, "empty": b"",
                         "nested": table([("a", b"F" + longstr(table([("b", b"V")])))])})
    write("fuzz_properties", {k: content_header(5, v) for k, v in PROPS.items()})
    publish = (frame(1, 1, METHODS["basic_publish"])
               + frame(2, 1, content_header(5, PROPS["persistent"]))
               + frame(3, 1, b"hello") + frame(8, 0, b""))
    # The first byte picks frame_max in fuzz_frame (odd: 4096, even: 512).
    write("fuzz_frame", {
        "publish": b"\x01" + publish,
        "handshake": b"\x01" + frame(1, 0, METHODS["connection_start"])
        + frame(1, 0, METHODS["connection_tune"]) + frame(1, 0, METHODS["connection_open"]),
        "heartbeats_small_max": b"\x00" + frame(8, 0, b"") * 3,
    })
    # fuzz_http: request heads with the headers the guard reads.
    basic = "Basic " + base64.b64encode(b"guest:guest").decode()
    write("fuzz_http", {
        "get_login": ("GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1:15672\r\n"
                      "Authorization: %s\r\nAccept: application/json\r\n\r\n" % basic).encode(),
        "put_policy": ("PUT /api/policies/%%2F/ha HTTP/1.1\r\nHost: [::1]:15672\r\n"
                       "Origin: http://[::1]:15672\r\nAuthorization: %s\r\n"
                       "Content-Type: application/json; charset=utf-8\r\nContent-Length: 2\r\n"
                       "\r\n{}" % basic).encode(),
        "cross_site_form": b"POST /api/cluster/leave HTTP/1.1\r\nHost: evil.example\r\n"
                           b"Origin: null\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                           b"Content-Length: 0\r\n\r\n",
        "basic_value": basic.encode(),
    })
    # fuzz_json: request bodies of the API.
    write("fuzz_json", {
        "move": b'{"vhost": "/", "queue": "q\\u00e9\\n", "to": "b3", "backup_of": "b2"}',
        "policy": b'{"pattern": "^ha\\\\.", "priority": -3, "backups": 2, "apply": null}',
        "rebalance": b'{"auto": true}',
        "surrogates": b'{"queue": "\\ud83d\\ude00 \\" x", "percent": 25}',
    })
    # fuzz_heartbeat: heartbeat bodies without their MAC (the harness signs
    # them): magic, version, flags, three sizes, reserved, id, sequence.
    def heartbeat(flags, name, amqp, cluster, id_, seq):
        return (b"QYHB" + struct.pack(">BBBBB", 1, flags, len(name), len(amqp), len(cluster))
                + b"\0" * 7 + struct.pack(">QQ", id_, seq) + name + amqp + cluster)
    write("fuzz_heartbeat", {
        "up": heartbeat(0, b"b1", b"10.0.0.1:5672", b"10.0.0.1:7001", 7, 1),
        "stopping_alarms": heartbeat(7, b"broker-two", b"[::1]:5672", b"127.0.0.1:7002",
                                     0xFFFFFFFF, 2 ** 63),
    })

    # fuzz_password: a byte picking the hashing_algorithm (0 none, 1..4 the
    # four names), then a stored hash of "secret" computed with hashlib.
    salt = b"\x01\x02\x03\x04"

    def rabbit(digest):
        return base64.b64encode(salt + digest(salt + b"secret").digest())

    def unpadded(b):
        return base64.b64encode(b).rstrip(b"=")
    kdf_salt = bytes(range(16))
    kdf = hashlib.pbkdf2_hmac("sha256", b"secret", kdf_salt, 1000)
    write("fuzz_password", {
        "sha256": b"\x00" + rabbit(hashlib.sha256),
        "sha512": b"\x02" + rabbit(hashlib.sha512),
        "md5": b"\x03" + rabbit(hashlib.md5),
        "pbkdf2": b"\x04$pbkdf2-sha256$i=1000$" + unpadded(kdf_salt) + b"$" + unpadded(kdf),
    })


if __name__ == "__main__":
    main()
