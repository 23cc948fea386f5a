"""Goal: no sequence of ordinary client operations, on any broker of a
cluster, takes a broker down or leaves the brokers disagreeing. Clients on
every broker declare, bind, publish (with TTLs, into length limits and
dead-letter exchanges; plain, confirmed or in transactions), get, consume,
ack, nack, reject, recover, purge and delete the same few exchanges and
queues at random, so that dead-lettering, expiry, auto-delete and deletions
cross brokers and race each other, while the queues move from broker to
broker (POST /api/cluster/move) under them.

Method: three quayd processes (tests/cluster/clustertest.py, one backup per
queue, broker b placing every queue elsewhere); four pika clients, each on a
broker picked by a seeded generator (SEED, default fixed; the seed is
printed), run random operations for DURATION seconds. A channel error is an
expected answer (an inequivalent redeclare, a queue deleted meanwhile); a
connection error other than a shutdown is a failure. Afterwards every broker
is alive and serves a fresh connection, every broker's view of the queues
agrees, and no log holds a sanitizer report or an assertion. The channel
errors are printed by kind: each must be one a single broker gives too.
Usage: 26-cluster-random-ops.py [DURATION] (default 20 s).
"""
import json
import os
import random
import re
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import Cluster, closer, run, test, wait_until  # noqa: E402

import pika  # noqa: E402
import pika.exceptions as pe  # noqa: E402

DURATION = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1][0].isdigit() else 20.0
if len(sys.argv) > 1 and sys.argv[1][0].isdigit():
    del sys.argv[1]
SEED = int(os.environ.get("SEED", "20261202"))
EXCHANGES = ["rx-%d" % i for i in range(4)]
QUEUES = ["rq-%d" % i for i in range(6)]
EXCHANGE_TYPES = ["direct", "fanout", "topic", "headers"]
KEYS = ["a", "b", "a.b", "#", ""]

cluster = None
members = []


def queue_arguments(rng):
    """One of a few argument sets (a redeclare with another is a 406)."""
    choice = rng.randrange(6)
    if choice == 0:
        return {}
    if choice == 1:
        return {"x-message-ttl": rng.choice([0, 20, 200])}
    if choice == 2:
        return {"x-max-length": rng.choice([1, 3]),
                "x-overflow": rng.choice(["drop-head", "reject-publish", "reject-publish-dlx"]),
                "x-dead-letter-exchange": rng.choice(EXCHANGES)}
    if choice == 3:
        return {"x-dead-letter-exchange": rng.choice(EXCHANGES),
                "x-dead-letter-routing-key": rng.choice(KEYS[:3])}
    if choice == 4:
        return {"x-expires": rng.choice([200, 1000])}
    return {"x-single-active-consumer": True}


class Worker:
    """One client: random operations until told to stop."""

    def __init__(self, index, member, seed):
        self.rng = random.Random(seed)
        self.member = member
        self.name = "w%d@%s" % (index, member.name)
        self.ops = 0
        self.channel_errors = 0
        self.failure = None
        self.conn = None
        self.ch = None
        self.tags = []
        self.tx = self.confirm = False  # the channel's mode
        self.errors = {}  # "code text" (names elided): count
        self.doing = "nothing yet"

    def connect(self):
        self.conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.member.amqp_port, heartbeat=0, socket_timeout=10,
            blocked_connection_timeout=30))
        self.ch = self.conn.channel()
        self.tags = []
        self.tx = self.confirm = False

    def channel(self):
        if self.ch is None or not self.ch.is_open:
            self.ch = self.conn.channel()
            self.tags = []
            self.tx = self.confirm = False
        return self.ch

    def op(self):
        rng, ch = self.rng, self.channel()
        x, q, key = rng.choice(EXCHANGES), rng.choice(QUEUES), rng.choice(KEYS)
        kind = rng.randrange(19)
        self.doing = "op %d kind %d (exchange %s, queue %s, key %r)" % (self.ops, kind, x, q, key)
        if kind == 0:
            ch.exchange_declare(x, rng.choice(EXCHANGE_TYPES), auto_delete=rng.random() < 0.3)
        elif kind == 1:
            ch.exchange_delete(x)
        elif kind == 2:
            ch.queue_declare(q, auto_delete=rng.random() < 0.2, arguments=queue_arguments(rng))
        elif kind == 3:
            ch.queue_delete(q)
        elif kind == 4:
            ch.queue_bind(q, x, key)
        elif kind == 5:
            ch.queue_unbind(q, x, key)
        elif kind in (6, 7, 8):
            props = pika.BasicProperties(expiration=str(rng.choice([1, 30, 500]))
                                         if rng.random() < 0.3 else None,
                                         delivery_mode=rng.choice([1, 2]))
            target = rng.choice([x, ""])
            ch.basic_publish(target, q if target == "" else key, b"r%d" % self.ops, props,
                             mandatory=rng.random() < 0.2)
        elif kind == 9:
            m, _, _ = ch.basic_get(q, auto_ack=False)
            if m is not None:
                how = rng.randrange(3)
                if how == 0:
                    ch.basic_ack(m.delivery_tag)
                elif how == 1:
                    ch.basic_nack(m.delivery_tag, requeue=rng.random() < 0.5)
                else:
                    ch.basic_reject(m.delivery_tag, requeue=False)
        elif kind == 10:
            ch.basic_qos(prefetch_count=rng.choice([0, 1, 5]), global_qos=rng.random() < 0.5)
            self.tags.append(ch.basic_consume(q, lambda c, m, p, b: c.basic_reject(
                m.delivery_tag, requeue=False), auto_ack=False))
        elif kind == 11 and self.tags:
            ch.basic_cancel(self.tags.pop(rng.randrange(len(self.tags))))
        elif kind == 12:
            ch.queue_purge(q)
        elif kind == 14 and not self.tx and not self.confirm:
            ch.tx_select()
            self.tx = True
        elif kind == 15 and self.tx:
            if rng.random() < 0.7:
                ch.tx_commit()
            else:
                ch.tx_rollback()
        elif kind == 16 and not self.tx and not self.confirm:
            ch.confirm_delivery()
            self.confirm = True
        elif kind == 17:
            ch.basic_recover(requeue=True)
        elif kind == 18:
            ch.basic_get(q, auto_ack=True)
        else:
            self.conn.process_data_events(time_limit=0.01)

    def run(self, until):
        try:
            self.connect()
            while time.monotonic() < until:
                try:
                    self.op()
                except pe.ChannelClosedByBroker as e:
                    self.channel_errors += 1
                    kind = "%d %s" % (e.reply_code, re.sub(r"'[^']*'", "_", e.reply_text))
                    self.errors[kind] = self.errors.get(kind, 0) + 1
                except (pe.UnroutableError, pe.NackError):
                    pass
                self.ops += 1
            self.conn.close()
        except pe.ConnectionClosedByBroker as e:
            self.failure = "%s: connection closed by %s: %d %s" % (
                self.name, self.member.name, e.reply_code, e.reply_text)
        except Exception as e:  # noqa: BLE001 -- any other is a failure too
            self.failure = "%s: %s: %r" % (self.name, type(e).__name__, e)


def mover(until, rng, refused):
    """Moves a random queue to a random broker every 0.2 s until until: 202
    (moving), 404 (no such queue now) and 409 (there already, or moving)
    are answers; any other goes to refused."""
    while time.monotonic() < until:
        time.sleep(0.2)
        body = json.dumps({"vhost": "/", "queue": rng.choice(QUEUES),
                           "to": rng.choice(members).name}).encode()
        status, answer = members[0].api_call("POST", "/api/cluster/move", body, timeout=10)
        if status not in (202, 404, 409):
            refused.append((status, answer))


def queue_names(member):
    return sorted(q["name"] for q in member.api_get("/api/queues", timeout=5))


@test(timeout=120)
def three_brokers():
    global cluster, members
    cluster = Cluster()
    members = cluster.form(["a", "b", "c"], per=lambda name: {
        "extra_args": ["--default-backups", "1"] +
                      (["--queue-locator", "others"] if name == "b" else [])})


@test(timeout=300)
def random_operations_leave_every_broker_up_and_agreeing():
    print("# seed %d, %.0f s" % (SEED, DURATION))
    rng = random.Random(SEED)
    workers = [Worker(i, rng.choice(members), rng.randrange(1 << 30)) for i in range(4)]
    until = time.monotonic() + DURATION
    threads = [threading.Thread(target=w.run, args=(until,), daemon=True) for w in workers]
    refused = []
    moving = threading.Thread(target=mover, args=(until, random.Random(rng.random()), refused),
                              daemon=True)
    for t in threads + [moving]:
        t.start()
    for t in threads + [moving]:
        t.join(max(until + 30 - time.monotonic(), 0.1))
    # pika's blocking calls never time out: a worker still running is one
    # whose request the broker never answered.
    hung = ["%s stuck in %s" % (w.name, w.doing)
            for w, t in zip(workers, threads) if t.is_alive()]
    assert not hung, hung
    for w in workers:
        print("# %s: %d operations, %d channel errors" % (w.name, w.ops, w.channel_errors))
    errors = {}
    for w in workers:
        for kind, n in w.errors.items():
            errors[kind] = errors.get(kind, 0) + n
    for kind, n in sorted(errors.items(), key=lambda e: -e[1]):
        print("#   %6d %s" % (n, kind[:110]))
    # Through a proxy as on one broker: no queue is ever "unavailable".
    assert not [k for k in errors if "unavailable" in k or k.startswith("541")], errors
    assert not refused, refused[:5]
    failures = [w.failure for w in workers if w.failure]
    assert not failures, failures
    for m in members:
        assert m.alive(), "%s died:\n%s" % (m.name, m.log_text()[-3000:])
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", m.amqp_port))
        c.channel().queue_declare("", exclusive=True)
        c.close()
    wait_until(lambda: len({tuple(queue_names(m)) for m in members}) == 1, 15,
               what="every broker to list the same queues")
    for m in members:
        assert "assertion failed" not in m.log_text(), m.name


if __name__ == "__main__":
    run(closer(lambda: cluster))
