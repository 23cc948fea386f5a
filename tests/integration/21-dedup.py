"""Goal: x-quay-dedup-window (quay's own queue argument) makes a publisher's
resends harmless: a message whose message-id the queue enqueued within the
window is confirmed but not enqueued again, on one broker and across a
failover (the backup keeps the queue's table from the replication stream,
and the promoted queue starts with it).

Method: (a) one quayd (tests/integration/quaytest.py's Broker) and pika
with confirms: duplicates, distinct ids, messages without an id, a
consumed original, the window running out, a full queue, a durable queue,
a window of 0. (b) three quayd processes (tests/cluster/clustertest.py): a
queue with x-quay-backups=1 and a window; ids 1..N confirmed through a
broker that is neither primary nor backup; kill -9 of the primary; after
the promotion ids 1..N again (half through the third broker, half on the
new primary itself) plus N+1..M; consuming everything must give exactly M
distinct messages.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import Cluster, queue_info, run, test, wait_until  # noqa: E402
from quaytest import Broker  # noqa: E402

import pika  # noqa: E402

single = None
cluster = None
members = {}


def connect_port(port):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, heartbeat=0, blocked_connection_timeout=30))


def confirming(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    return ch


def publish(ch, body, message_id=None, queue="dd", persistent=False):
    """Publishes with confirms: pika raises if the broker nacks (or returns)."""
    props = pika.BasicProperties(message_id=message_id,
                                 delivery_mode=2 if persistent else None)
    ch.basic_publish("", queue, body, properties=props, mandatory=True)


def count(ch, queue):
    return ch.queue_declare(queue, passive=True).method.message_count


def drain(ch, queue):
    """Every ready message's body, acked."""
    bodies = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return bodies
        bodies.append(body)


# ---- (a) one broker ---------------------------------------------------------


@test(timeout=60)
def one_broker():
    global single
    single = Broker(external_ok=False)


@test(timeout=60)
def a_resent_id_is_confirmed_but_not_enqueued():
    c = connect_port(single.port)
    ch = confirming(c)
    ch.queue_declare("dd", arguments={"x-quay-dedup-window": 60000})
    publish(ch, b"first", "id-1")
    publish(ch, b"again", "id-1")      # acked (a nack would raise)
    assert count(ch, "dd") == 1
    publish(ch, b"other", "id-2")      # a different id goes in
    publish(ch, b"anon-1")             # no id: never held back
    publish(ch, b"anon-2")
    publish(ch, b"empty-1", "")        # an empty id is no id
    publish(ch, b"empty-2", "")
    assert count(ch, "dd") == 6
    assert drain(ch, "dd") == [b"first", b"other", b"anon-1", b"anon-2", b"empty-1",
                               b"empty-2"]
    # Consumed (and acked): the id is still remembered within the window.
    publish(ch, b"third time", "id-1")
    publish(ch, b"other again", "id-2")
    assert count(ch, "dd") == 0
    # A purge does not forget either.
    publish(ch, b"id-3", "id-3")
    ch.queue_purge("dd")
    publish(ch, b"id-3 again", "id-3")
    assert count(ch, "dd") == 0
    # Another queue has its own window.
    ch.queue_declare("dd-other", arguments={"x-quay-dedup-window": 60000})
    publish(ch, b"elsewhere", "id-1", queue="dd-other")
    assert count(ch, "dd-other") == 1
    ch.queue_delete("dd")
    ch.queue_delete("dd-other")
    c.close()


@test(timeout=60)
def the_id_is_welcome_again_once_the_window_passed():
    c = connect_port(single.port)
    ch = confirming(c)
    ch.queue_declare("short", arguments={"x-quay-dedup-window": 400})
    publish(ch, b"1", "x", queue="short")
    time.sleep(0.2)
    publish(ch, b"2", "x", queue="short")   # within the window: held back
    assert count(ch, "short") == 1
    # The window counts from the first publish, not the latest resend:
    # 0.45 s after the first (0.25 s after the resend) it has passed.
    time.sleep(0.25)
    publish(ch, b"3", "x", queue="short")
    assert count(ch, "short") == 2
    publish(ch, b"4", "x", queue="short")
    assert drain(ch, "short") == [b"1", b"3"]
    ch.queue_delete("short")
    c.close()


@test(timeout=60)
def durable_full_and_zero_window_queues():
    c = connect_port(single.port)
    ch = confirming(c)
    # Durable, persistent: the resend's confirm waits for the original's
    # fsync, and comes.
    ch.queue_declare("dd-durable", durable=True, arguments={"x-quay-dedup-window": 60000})
    for _ in range(3):
        publish(ch, b"p", "same", queue="dd-durable", persistent=True)
    assert count(ch, "dd-durable") == 1
    # A full reject-publish queue still acks the resend of what it holds,
    # and nacks a new id.
    ch.queue_declare("dd-full", arguments={"x-quay-dedup-window": 60000, "x-max-length": 1,
                                           "x-overflow": "reject-publish"})
    publish(ch, b"in", "held", queue="dd-full")
    publish(ch, b"in again", "held", queue="dd-full")
    try:
        publish(ch, b"new", "new", queue="dd-full")
        raise AssertionError("a full reject-publish queue acked a new message")
    except pika.exceptions.NackError:
        pass
    # A window of 0 is no window.
    ch.queue_declare("dd-zero", arguments={"x-quay-dedup-window": 0})
    publish(ch, b"a", "z", queue="dd-zero")
    publish(ch, b"b", "z", queue="dd-zero")
    assert count(ch, "dd-zero") == 2
    for q in ("dd-durable", "dd-full", "dd-zero"):
        ch.queue_delete(q)
    c.close()


# ---- (b) a cluster, across a failover ---------------------------------------


@test(timeout=120)
def three_brokers():
    global cluster
    cluster = Cluster()
    for m in cluster.form(["a", "b", "c"]):
        members[m.name] = m


@test(timeout=120)
def resends_after_a_failover_make_no_duplicates():
    n, m_total = 200, 300
    c = connect_port(members["a"].amqp_port)
    c.channel().queue_declare("dd-ha", arguments={"x-quay-backups": 1,
                                                  "x-quay-dedup-window": 120000})
    c.close()
    info = queue_info(members["a"], "dd-ha")
    assert len(info["backups"]) == 1 and info["in_sync"] == info["backups"], info
    primary = members[info["primary"]]
    backup = members[info["backups"][0]]
    other = [m for m in members.values() if m not in (primary, backup)][0]
    c = connect_port(other.amqp_port)
    ch = confirming(c)
    for i in range(1, n + 1):
        publish(ch, b"%d" % i, "m-%d" % i, queue="dd-ha")
    # Resends before the failover are held back by the primary.
    for i in range(1, 11):
        publish(ch, b"%d" % i, "m-%d" % i, queue="dd-ha")
    c.close()
    # Confirmed means on the backup, and its table has every id.
    got = queue_info(backup, "dd-ha")
    assert got["replica_messages"] == n and got["dedup_ids"] == n, got
    t0 = primary.kill()
    wait_until(lambda: queue_info(other, "dd-ha")["primary"] == backup.name, 10,
               what="the backup promoted")
    wait_until(lambda: queue_info(backup, "dd-ha")["role"] == "primary", 10,
               what="the new primary to know it")
    print("# promoted %.2f s after kill -9 of the primary" % (time.monotonic() - t0))
    got = queue_info(backup, "dd-ha")
    assert got["dedup_ids"] == n, got  # the promoted queue took the replica's table
    # The publisher does not know what got in: it sends everything again,
    # through the third broker and on the new primary itself, then more.
    c1 = connect_port(other.amqp_port)
    c2 = connect_port(backup.amqp_port)
    via_other, on_primary = confirming(c1), confirming(c2)
    for i in range(1, n + 1):
        publish(via_other if i % 2 else on_primary, b"%d" % i, "m-%d" % i, queue="dd-ha")
    for i in range(n + 1, m_total + 1):
        publish(via_other if i % 2 else on_primary, b"%d" % i, "m-%d" % i, queue="dd-ha")
    c1.close()
    bodies = drain(on_primary, "dd-ha")
    c2.close()
    numbers = sorted(int(b) for b in bodies)
    assert len(numbers) == len(set(numbers)), \
        "%d duplicates" % (len(numbers) - len(set(numbers)))
    assert numbers == list(range(1, m_total + 1)), (len(numbers), numbers[:5], numbers[-5:])
    primary.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(primary.name) == "up"
                           for m in members.values()), 20, what="the old primary back")


@test(timeout=120)
def a_backup_caught_up_later_learns_the_ids():
    c = connect_port(members["a"].amqp_port)
    c.channel().queue_declare("dd-late", arguments={"x-quay-backups": 1,
                                                    "x-quay-dedup-window": 120000})
    c.close()
    wait_until(lambda: len((queue_info(members["a"], "dd-late") or {}).get("in_sync", [])) == 1,
               10, what="the backup in sync")
    info = queue_info(members["a"], "dd-late")
    primary, backup = members[info["primary"]], members[info["backups"][0]]
    third = [m for m in members.values() if m not in (primary, backup)][0]
    c = connect_port(primary.amqp_port)
    ch = confirming(c)
    for i in range(1, 101):
        publish(ch, b"%d" % i, "late-%d" % i, queue="dd-late")
    assert len(drain(ch, "dd-late")) == 100  # consumed: the ids stay, the messages go
    c.close()
    backup.kill()
    # The controller gives the queue a new backup; the primary catches it
    # up from an empty queue: only the ids to send.
    wait_until(lambda: (queue_info(primary, "dd-late") or {}).get("in_sync") == [third.name], 15,
               what="the third broker caught up as the new backup")
    got = queue_info(third, "dd-late")
    assert got["role"] == "backup" and got["replica_messages"] == 0, got
    assert got["dedup_ids"] == 100, got
    backup.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(backup.name) == "up"
                           for m in members.values()), 20, what="the old backup back")


def cleanup(failed):
    problems = []
    if single is not None:
        problems += single.stop()
    if cluster is not None:
        cluster.failed = failed
        problems += cluster.close()
    return problems


if __name__ == "__main__":
    run(cleanup)
