"""Clients that keep a queue busy while a cluster changes shape under them
(tests/integration/28-cluster-move.py, 29-cluster-rebalance.py): a
confirming publisher, a late-acking consumer, and the check that each
publisher's messages arrive in order. Each records what it saw for the test
to check; none raises (errors are recorded).
"""
import threading
import time

import pika

from clustertest import connect


class Publisher(threading.Thread):
    """Publishes persistent messages "NAME-i" with confirms through one
    broker until stopped; records what was confirmed and any nack, and the
    longest wait for one confirm."""

    def __init__(self, name, member, queue, rate):
        super().__init__(daemon=True)
        self.name_, self.member, self.queue, self.period = name, member, queue, 1.0 / rate
        self.confirmed, self.nacked, self.errors = [], [], []
        self.longest = 0.0
        self.stopping = threading.Event()

    def run(self):
        try:
            conn = connect(self.member)
            ch = conn.channel()
            ch.confirm_delivery()
            i = 0
            while not self.stopping.is_set():
                body = b"%s-%d" % (self.name_.encode(), i)
                t0 = time.monotonic()
                try:
                    ch.basic_publish("", self.queue, body,
                                     pika.BasicProperties(delivery_mode=2), mandatory=True)
                    self.confirmed.append(body)
                except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                    self.nacked.append(body)
                self.longest = max(self.longest, time.monotonic() - t0)
                i += 1
                time.sleep(self.period)
            conn.close()
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.errors.append(repr(e))


class Consumer(threading.Thread):
    """Consumes with manual acks (prefetch 20) through one broker, each ack
    ack_delay seconds after its delivery (so that deliveries are
    outstanding when the queue moves); records every delivery and whether
    it was ever cancelled."""

    def __init__(self, member, queue, ack_delay=0.1):
        super().__init__(daemon=True)
        self.member, self.queue, self.ack_delay = member, queue, ack_delay
        self.got, self.redelivered, self.errors = [], 0, []
        self.cancelled = False
        self.stopping = threading.Event()

    def run(self):
        try:
            conn = connect(self.member)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=20)
            unacked = []

            def on_message(ch, method, props, body):
                self.got.append(body)
                self.redelivered += method.redelivered
                unacked.append((time.monotonic() + self.ack_delay, method.delivery_tag))

            def on_cancel(frame):
                self.cancelled = True

            ch.add_on_cancel_callback(on_cancel)
            ch.basic_consume(self.queue, on_message)
            while not self.stopping.is_set() or unacked:
                conn.process_data_events(time_limit=0.01)
                now = time.monotonic()
                while unacked and unacked[0][0] <= now:
                    ch.basic_ack(unacked.pop(0)[1])
            conn.close()
        except Exception as e:  # noqa: BLE001
            self.errors.append(repr(e))


def in_order(got):
    """Whether each publisher's messages come in publish order."""
    last = {}
    for body in got:
        name, i = body.rsplit(b"-", 1)
        if int(i) <= last.get(name, -1):
            return False
        last[name] = int(i)
    return True
