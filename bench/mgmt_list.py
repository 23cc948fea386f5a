"""GET /api/queues through a broker that is primary of none of the queues.

A 3-broker test cluster (tests/integration/quaytest.py, cluster mode: the
client broker "b" places every queue elsewhere) gets N queues with one
message each, declared through b; then b's /api/queues is read three times
and once paged. Each read asks every queue's primary for its counts through
the stand-ins (mgmt/api_queues.c): the figure is the time of the whole
answer, and how many queues were counted at their primary (all of them, or
the listing fell back to local counts).

  QUAYD=build-asan/quayd /usr/bin/python3 bench/mgmt_list.py 5000
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
os.environ.setdefault("QUAY_TEST_MODE", "cluster")
from quaytest import Broker  # noqa: E402

import pika  # noqa: E402


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    b = Broker(external_ok=False, http=True)
    try:
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", b.port))
        ch = c.channel()
        t0 = time.time()
        for i in range(n):
            ch.queue_declare("bl-%05d" % i)
            ch.basic_publish("", "bl-%05d" % i, b"x")
        print("declared %d queues in %.1f s" % (n, time.time() - t0))
        for _ in range(3):
            t0 = time.time()
            status, qs = b.api_call("GET", "/api/queues", timeout=60)
            dt = time.time() - t0
            print("GET /api/queues: %d, %d queues in %.3f s, %d counted at their primary, "
                  "%d messages ready" % (status, len(qs), dt,
                                         sum(q["counts_from"] == "primary" for q in qs),
                                         sum(q["messages_ready"] for q in qs)))
        t0 = time.time()
        b.api_call("GET", "/api/queues?page=1&page_size=100&columns=name,messages", timeout=60)
        print("one page of 100: %.3f s" % (time.time() - t0))
        c.close()
    finally:
        for problem in b.stop():
            print("problem:", problem)


if __name__ == "__main__":
    main()
