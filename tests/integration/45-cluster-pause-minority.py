"""Goal: with --partition-handling pause-minority, a broker cut off from the
cluster's majority sends its clients away, as RabbitMQ's pause_minority
does: it can confirm nothing (the lease) and reach no primary on the other
side, while its clients would wait on it for as long as the cut lasts.
About 3 s after it stops hearing the majority it closes its clients'
connections (320 CONNECTION_FORCED) and refuses new ones at connection.open
(320) until it hears the majority again; the majority goes on serving; its
brokers' links stay, and after the heal it takes clients again. With the
default (ignore) a cut-off broker keeps its clients (19-cluster-partition).

Method: three quayd processes, each in its own network namespace
(tests/cluster/netlab.py); the partition silently drops packets between
the hosts while the test process reaches every broker through the bridge.
"""
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, closer, connect_as, lab_trio, metric, run, test,  # noqa: E402
                         wait_until)
from netlab import Lab  # noqa: E402

import pika  # noqa: E402

lab = cluster = None
A = B = C = None
USER, PASSWORD = "tester", "lab-pass"
FORCED = 320


def connect(member):
    return connect_as(member, USER, PASSWORD)


def refused(member):
    """The reply code a new connection to member gets at connection.open,
    or None if it opens."""
    try:
        connect(member).close()
        return None
    except pika.exceptions.AMQPConnectionError as e:
        found = re.search(r"\b(3\d\d)\b", repr(e))
        return int(found.group(1)) if found else repr(e)


@test(timeout=120)
def three_brokers_pausing_their_minority():
    global lab, cluster, A, B, C
    lab = Lab(3)
    cluster = Cluster()
    A, B, C = lab_trio(lab, cluster, ["--users", cluster.users_file(USER, PASSWORD),
                                      "--partition-handling", "pause-minority"])
    assert metric(C, "quay_cluster_paused") == 0


@test(timeout=120)
def the_cut_off_broker_sends_its_clients_away_until_the_heal():
    client = connect(C)
    client.channel()
    lab.partition([1, 2], [3])
    t0 = time.monotonic()
    closed = None
    while time.monotonic() - t0 < 15:
        try:
            client.process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as e:
            closed = (e.reply_code, e.reply_text)
            break
    took = time.monotonic() - t0
    assert closed is not None, "c kept its client 15 s after the cut"
    assert closed[0] == FORCED and "majority" in closed[1], closed
    # Not on a blip: it lost its lease (~1 s), then waited 3 s more.
    assert took >= 3.0, "c sent its client away %.2f s after the cut" % took
    print("# c closed its client's connection %.2f s after the cut: %r" % (took, closed))
    eq_code = refused(C)
    assert eq_code == FORCED, "a new connection to c: %r (want 320)" % (eq_code,)
    assert metric(C, "quay_cluster_paused") == 1
    assert metric(C, "quay_cluster_pauses_total") == 1
    # The majority goes on: a client there declares, publishes, consumes.
    a = connect(A)
    ch = a.channel()
    ch.confirm_delivery()
    ch.queue_declare("during-the-cut")
    ch.basic_publish("", "during-the-cut", b"m")
    got = ch.basic_get("during-the-cut", auto_ack=True)
    assert got[2] == b"m", got
    assert metric(A, "quay_cluster_paused") == 0
    a.close()
    lab.heal()
    t1 = time.monotonic()
    wait_until(lambda: refused(C) is None, 30, what="c to take clients again")
    print("# c took clients again %.2f s after the heal" % (time.monotonic() - t1))
    assert metric(C, "quay_cluster_paused") == 0
    c = connect(C)
    ch = c.channel()
    ch.queue_declare("after-the-heal")
    ch.queue_delete("after-the-heal")
    c.close()


if __name__ == "__main__":
    run(closer(lambda: cluster, lambda: lab))
