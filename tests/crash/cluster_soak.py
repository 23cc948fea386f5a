"""cluster_soak.py -- a fault soak of a quay cluster: no confirmed message lost.

Three brokers (tests/cluster/clustertest.py), one queue with two backups. A
confirming publisher and an acking consumer, each on a broker of its own,
run the whole time; each reconnects to another broker when its connection
dies (resending the messages that were not confirmed: at-least-once). Every
FAULT_EVERY seconds a random broker is killed with kill -9 and restarted
FAULT_DOWN seconds later. At the end the consumer drains the queue and the
checker prints:

  confirmed   messages whose publish was confirmed
  received    distinct messages the consumer got
  duplicates  deliveries of a message already received (allowed: resent
              unconfirmed publishes, redeliveries after a broker died)
  lost        confirmed messages never received (must be 0)

Usage: /usr/bin/python3 tests/crash/cluster_soak.py [SECONDS]   (default 120)
Environment: QUAYD=build/quayd FAULT_EVERY=20 FAULT_DOWN=5
Exit status 0 only when nothing confirmed was lost.
"""
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
from clustertest import Cluster, wait_until  # noqa: E402

import pika  # noqa: E402

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
FAULT_EVERY = float(os.environ.get("FAULT_EVERY", "20"))
FAULT_DOWN = float(os.environ.get("FAULT_DOWN", "5"))
QUEUE = "soak"

stop = threading.Event()
lock = threading.Lock()
confirmed = set()
received = set()
stats = {"duplicates": 0, "publish_reconnects": 0, "consume_reconnects": 0, "kills": 0,
         "nacked": 0}


def connect(member):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", member.amqp_port, heartbeat=5, socket_timeout=5,
        blocked_connection_timeout=30, connection_attempts=1))


def publisher(members):
    n = 0
    pending = []  # sent, not confirmed yet: resent after a reconnect
    i = 0
    while not stop.is_set():
        member = members[i % len(members)]
        i += 1
        if not member.alive():
            time.sleep(0.1)
            continue
        try:
            c = connect(member)
            ch = c.channel()
            ch.confirm_delivery()
            while not stop.is_set():
                if pending:
                    body = pending[0]
                else:
                    n += 1
                    body = n
                    pending.append(body)
                try:
                    ch.basic_publish("", QUEUE, b"%d" % body)
                    with lock:
                        confirmed.add(body)
                except pika.exceptions.NackError:
                    with lock:
                        stats["nacked"] += 1
                    continue  # resent
                pending.pop(0)
            c.close()
        except Exception:
            with lock:
                stats["publish_reconnects"] += 1
            time.sleep(0.2)


def consumer(members, drain_done):
    i = 1
    while True:
        member = members[i % len(members)]
        i += 1
        if not member.alive():
            time.sleep(0.1)
            continue
        try:
            c = connect(member)
            ch = c.channel()
            ch.basic_qos(prefetch_count=200)
            idle_since = [time.monotonic()]

            def on_message(ch_, m, p, body):
                v = int(body)
                with lock:
                    if v in received:
                        stats["duplicates"] += 1
                    received.add(v)
                idle_since[0] = time.monotonic()
                ch_.basic_ack(m.delivery_tag)
            ch.basic_consume(QUEUE, on_message)
            while True:
                c.process_data_events(time_limit=0.5)
                if stop.is_set() and time.monotonic() - idle_since[0] > 5:
                    c.close()
                    drain_done.set()
                    return
        except Exception:
            with lock:
                stats["consume_reconnects"] += 1
            time.sleep(0.2)


def main():
    cluster = Cluster()
    lost = None
    try:
        a = cluster.add("a")
        wait_until(lambda: len(cluster.leaders([a])) == 1, 15)
        b = cluster.add("b", join=[a])
        c = cluster.add("c", join=[a, b])
        members = [a, b, c]
        expect = {"a": "up", "b": "up", "c": "up"}
        wait_until(lambda: all(m.view() and m.view().brokers == expect for m in members), 30)
        wait_until(lambda: all(m.log_text().count("is up") >= 2 for m in members), 15)
        conn = connect(a)
        conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-quay-backups": 2})
        conn.close()
        drain_done = threading.Event()
        threads = [threading.Thread(target=publisher, args=(members,), daemon=True),
                   threading.Thread(target=consumer, args=(members, drain_done), daemon=True)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < DURATION:
            time.sleep(FAULT_EVERY)
            if time.monotonic() - t0 >= DURATION:
                break
            victim = random.choice(members)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            stats["kills"] += 1
            time.sleep(FAULT_DOWN)
            victim.start()
            wait_until(lambda: all(m.view() and m.view().brokers.get(victim.name) == "up"
                                   for m in members), 60, what="the killed broker back")
            with lock:
                print("# %4.0f s: kill -9 %s; confirmed %d, received %d, duplicates %d" % (
                    time.monotonic() - t0, victim.name, len(confirmed), len(received),
                    stats["duplicates"]), flush=True)
        stop.set()
        drain_done.wait(120)
        with lock:
            lost = confirmed - received
            print("RESULT seconds=%.0f kills=%d confirmed=%d received=%d duplicates=%d "
                  "nacked=%d lost=%d publish_reconnects=%d consume_reconnects=%d" % (
                      time.monotonic() - t0, stats["kills"], len(confirmed), len(received),
                      stats["duplicates"], stats["nacked"], len(lost),
                      stats["publish_reconnects"], stats["consume_reconnects"]), flush=True)
    finally:
        cluster.failed = lost is None or bool(lost)
        cluster.close()
    sys.exit(0 if lost == set() else 1)


if __name__ == "__main__":
    main()
