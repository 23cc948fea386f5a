"""bench/mgmt_list_diff.py: every list a client can grow, as a broker answers it, for a
before/after diff of a change to how lists are built (bench/RESULTS.md "Every long list in
slices"): 19 paths (/api/bindings, /api/exchanges, /api/connections, /api/channels,
/api/consumers, their per-vhost forms, a queue's and an exchange's bindings, those between
two objects, /api/queues) x 16 queries (sort=, sort_reverse=, columns=, pages, name=, bad
pages), and GET /api/definitions whole and per vhost, on one broker or (QUAY_TEST_MODE=cluster) through a 3-broker cluster, with a few
queues, exchanges, bindings, connections, channels and consumers in two vhosts.

The tables' order (bindings, connections, channels and consumers have no default order) comes
from a hash keyed at random per process: a preloaded getrandom gives every process the same
key, so two brokers built alike list alike. Ports, connected_at, rates, byte counts and
password hashes (salted by OpenSSL) are masked. In a cluster /api/queues still differs between runs (where each queue is placed).

  QUAYD=/tmp/base-quayd /usr/bin/python3 bench/mgmt_list_diff.py /tmp/before.txt
  QUAYD=build/quayd /usr/bin/python3 bench/mgmt_list_diff.py /tmp/after.txt
  diff /tmp/before.txt /tmp/after.txt

Release builds (ASan refuses a preload ahead of its runtime).
"""
import http.client
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from quaytest import *  # noqa: E402,F403

import pika  # noqa: E402

FIXED_RANDOM = r"""
#include <string.h>
#include <sys/types.h>
ssize_t getrandom(void *buf, size_t n, unsigned flags)
{
    (void)flags;
    memset(buf, 0x5a, n);
    return (ssize_t)n;
}
"""
build = tempfile.mkdtemp(prefix="list-diff.")
with open(os.path.join(build, "fixrand.c"), "w") as f:
    f.write(FIXED_RANDOM)
preload = os.path.join(build, "fixrand.so")
subprocess.check_call(["cc", "-shared", "-fPIC", "-O2", "-o", preload,
                       os.path.join(build, "fixrand.c")])
out = open(sys.argv[1], "w")
b = Broker(external_ok=False, http=True, env=dict(os.environ, LD_PRELOAD=preload))
try:
    wait_until(lambda: port_accepts(b.http_port), what="http")
    b.api_call("PUT", "/api/vhosts/v2")
    b.api_call("PUT", "/api/permissions/v2/guest",
               {"configure": ".*", "write": ".*", "read": ".*"})
    conns = []
    for vh in ("/", "v2"):
        c = pika.BlockingConnection(pika.ConnectionParameters(b.host, b.port, virtual_host=vh,
                                                              heartbeat=0))
        conns.append(c)
        ch = c.channel()
        for i in range(8):
            ch.queue_declare("q%d" % i)
        for x, t in (("x-direct", "direct"), ("x-topic", "topic"), ("x-fan", "fanout"),
                     ("a-first", "headers")):
            args = {"alternate-exchange": "amq.direct"} if t == "fanout" else None
            ch.exchange_declare(x, t, arguments=args)
        for i in range(6):
            ch.queue_bind("q%d" % i, "x-direct", "rk%d" % (i % 3))
            ch.queue_bind("q%d" % i, "x-topic", "a.%d.#" % i, arguments={"x-k": i})
        ch.queue_bind("q0", "x-direct", "rk-extra")
        ch.exchange_bind("x-fan", "x-direct", "e2e")
        ch.exchange_bind("x-topic", "x-direct", "e2e2")
    for n in range(3):
        c = pika.BlockingConnection(pika.ConnectionParameters(b.host, b.port, heartbeat=0))
        conns.append(c)
        for k in range(2):
            ch = c.channel()
            ch.basic_qos(prefetch_count=5 + k)
            if k == 1:
                ch.confirm_delivery()
            for q in range(n + k + 1):
                ch.basic_consume("q%d" % q, lambda *a: None,
                                 consumer_tag="t%d-%d-%d" % (n, k, q))
    time.sleep(1)
    paths = ["/api/bindings", "/api/bindings/%2F", "/api/bindings/v2", "/api/exchanges",
             "/api/exchanges/%2F", "/api/exchanges/v2", "/api/connections", "/api/channels",
             "/api/consumers", "/api/consumers/%2F", "/api/consumers/v2",
             "/api/queues/%2F/q0/bindings", "/api/queues/%2F/q6/bindings",
             "/api/exchanges/%2F/x-direct/bindings/source",
             "/api/exchanges/%2F/x-fan/bindings/destination",
             "/api/bindings/%2F/e/x-direct/q/q0", "/api/bindings/%2F/e//q/q1",
             "/api/bindings/%2F/e/x-direct/e/x-fan", "/api/queues"]
    queries = ["", "?sort_reverse=true", "?sort=name", "?sort=name&sort_reverse=true",
               "?sort=routing_key", "?sort=destination&sort_reverse=true",
               "?columns=name,vhost,source,destination,routing_key,consumer_tag,number",
               "?columns=queue.name,channel_details.number,arguments",
               "?page=1&page_size=3", "?page=2&page_size=3&name=q",
               "?page=2&page_size=4&sort=routing_key&sort_reverse=true",
               "?page=99&page_size=500", "?page=1&page_size=501", "?sort=consumer_tag",
               "?sort=type,name&columns=name,type", "?sort=prefetch_count,consumer_tag"]
    # The definitions (not lists: no queries), whole and per vhost.
    gets = [p + q for p in paths for q in queries] + [
        "/api/definitions", "/api/definitions/%2F", "/api/definitions/v2"]
    for p in gets:
        conn = http.client.HTTPConnection("127.0.0.1", b.http_port, timeout=30)
        conn.request("GET", p, headers={
            "Authorization": api_authorization(API_USER, API_PASSWORD)})
        r = conn.getresponse()
        body = r.read().decode()
        conn.close()
        body = re.sub(r":\d{4,5}\b", ":PORT", body)
        body = re.sub(r'"(peer_port|port|connected_at)":\d+', r'"\1":N', body)
        body = re.sub(r'"rate":[-\d.e]+', '"rate":R', body)
        body = re.sub(r'"(recv_oct|send_oct)":\d+', r'"\1":N', body)
        # A salted hash: OpenSSL's salt does not come through the preload.
        body = re.sub(r'"password_hash":"[^"]*"', '"password_hash":H', body)
        out.write("%s %d\n%s\n" % (p, r.status, body))
    for c in conns:
        c.close()
finally:
    problems = b.stop()
    assert not problems, problems
