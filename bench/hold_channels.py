"""bench/hold_channels.py: holds CHANNELS open AMQP channels on a broker, 2,000 a connection
(channel_max 2047), consumers too with --consumers (one a channel, on queue hold-N of its
connection), until killed: the fill of bench/mgmt_list_lag.sh's FILL=channels (GET
/api/channels, /api/connections, /api/consumers of many). Prints "ready N" once all are open.

  /usr/bin/python3 bench/hold_channels.py PORT CHANNELS [--consumers]
"""
import os
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from quaytest import (BASIC_CONSUME_OK, CHANNEL_OPEN_OK, QUEUE_DECLARE_OK,  # noqa: E402
                      expect_method, gen_basic_consume, gen_channel_open, gen_queue_declare,
                      handshake)

PER_CONNECTION = 2000

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
port, count = int(sys.argv[1]), int(sys.argv[2])
consumers = "--consumers" in sys.argv[3:]
socks = []
left = count
while left > 0:
    n = min(left, PER_CONNECTION)
    s = socket.create_connection(("127.0.0.1", port), timeout=300)
    handshake(s)
    s.sendall(b"".join(gen_channel_open(c) for c in range(1, n + 1)))
    for c in range(1, n + 1):
        expect_method(s, *CHANNEL_OPEN_OK, channel=c, timeout=300)
    if consumers:
        queue = "hold-%d" % len(socks)
        s.sendall(gen_queue_declare(1, queue))
        expect_method(s, *QUEUE_DECLARE_OK, channel=1, timeout=300)
        s.sendall(b"".join(gen_basic_consume(c, queue, "hold-%d-%d" % (len(socks), c))
                           for c in range(1, n + 1)))
        for c in range(1, n + 1):
            expect_method(s, *BASIC_CONSUME_OK, channel=c, timeout=300)
    socks.append(s)
    left -= n
print("ready %d" % count, flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
