"""Goal: shared storage that fills up is answered as a broker's own disk
is. The disk alarm (--disk-free-limit) watches the filesystem the journal
is on, the shared one with --shared-storage, not only the data directory:
as the shared storage runs low every broker blocks its publishers (a
cluster-wide alarm), and once consumers free the space the alarm clears
and publishing goes on. With the alarm off, a write that finds the storage
full fails the journal as on a local disk: the publishes waiting for it
are nacked, nothing already confirmed is lost, the broker stays up and
says so (/api/overview's journal status).

Method: three quayd processes (tests/cluster/clustertest.py) whose
--shared-storage is a small tmpfs the test mounts (root, as CI runs; 77
otherwise); 64 KiB persistent messages confirmed through pika; the alarms
read from /api/overview.
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import Cluster, connect, queue_info, read_all, run, test, wait_until  # noqa: E402

import pika  # noqa: E402

PERSISTENT = pika.BasicProperties(delivery_mode=2)
BODY = b"s" * 65536
MiB = 1024 * 1024
clusters = []
mounts = []


def shared_cluster(size_mib, disk_free_limit):
    """A 3-broker cluster on a fresh tmpfs of size_mib as its shared
    storage; returns (cluster, {name: member}, mount point)."""
    cluster = Cluster()
    clusters.append(cluster)
    shared = os.path.join(cluster.dir, "shared")
    os.makedirs(shared)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % size_mib, "tmpfs", shared],
                   check=True)
    mounts.append(shared)
    members = {m.name: m for m in cluster.form(
        ["a", "b", "c"], extra_args=["--shared-storage", shared,
                                     "--disk-free-limit", str(disk_free_limit)])}
    return cluster, members, shared


def queue_on(via, prefix, owner):
    """A durable queue without backups whose primary is owner."""
    conn = connect(via)
    ch = conn.channel()
    try:
        for i in range(64):
            name = "%s-%d" % (prefix, i)
            ch.queue_declare(name, durable=True, arguments={"x-quay-backups": 0})
            if queue_info(via, name)["primary"] == owner:
                return name
            ch.queue_delete(name)
    finally:
        conn.close()
    raise AssertionError("no queue placed on %s" % owner)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def alarms(member):
    return member.api_get("/api/overview", timeout=5)


@test(timeout=180)
def the_disk_alarm_watches_the_shared_storage():
    _, members, shared = shared_cluster(96, 48 * MiB)
    a, c = members["a"], members["c"]
    q = queue_on(a, "full-alarm", "c")
    free = wait_until(lambda: alarms(c)["disk"]["free_bytes"], 10, what="a disk sample")
    assert free <= 96 * MiB, free  # the tmpfs's, not the data directory's
    blocked = []
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", c.amqp_port, blocked_connection_timeout=60))
    conn.add_on_connection_blocked_callback(lambda *args: blocked.append(time.monotonic()))
    ch = conn.channel()  # no confirms: a blocked broker does not read them
    sent = 0
    # 48 MiB of free space left: about 768 messages. Publish until blocked.
    while not blocked and sent < 2000:
        ch.basic_publish("", q, BODY, PERSISTENT)
        sent += 1
        if sent % 16 == 0:
            conn.process_data_events(0.01)
    assert blocked, "never blocked after %d messages (%d bytes free)" % (sent, free_bytes(shared))
    print("# blocked after %d x 64 KiB; %d MiB free" % (sent, free_bytes(shared) // MiB))
    for m in members.values():
        wait_until(lambda: "disk" in alarms(m)["alarms"], 10, what="%s's disk alarm" % m.name)
    assert free_bytes(shared) < 48 * MiB
    # Consumed: the journal drops the segments, the alarm clears, the
    # blocked publisher goes on (what it sent since waited in its socket).
    got = read_all(a, q)
    assert 0 < len(got) <= sent, (len(got), sent)
    wait_until(lambda: not any(alarms(m)["alarms"] for m in members.values()), 30,
               what="the alarms cleared", detail=lambda: (free_bytes(shared) // MiB,
                                                          alarms(c)["alarms"]))
    ch.confirm_delivery()
    ch.basic_publish("", q, b"after", PERSISTENT)  # confirmed: the rest went in before it
    conn.close()
    assert got + read_all(a, q) == [BODY] * sent + [b"after"]


@test(timeout=180)
def a_full_shared_storage_fails_the_journal_and_loses_nothing_confirmed():
    _, members, shared = shared_cluster(24, 0)
    a, c = members["a"], members["c"]
    q = queue_on(a, "full-nack", "c")
    conn = connect(c)
    ch = conn.channel()
    ch.confirm_delivery()
    confirmed, nacked = [], None
    for i in range(1000):
        body = b"%05d" % i + BODY
        try:
            ch.basic_publish("", q, body, PERSISTENT)
        except pika.exceptions.NackError:
            nacked = body
            break
        confirmed.append(body)
    assert nacked is not None, "24 MiB took %d x 64 KiB without a nack" % len(confirmed)
    print("# nacked at message %d (%d KiB free)" % (len(confirmed), free_bytes(shared) // 1024))
    assert c.alive()
    assert "journal failed" in c.log_text()
    assert alarms(c)["journal"]["status"] < 0, alarms(c)["journal"]
    # Later persistent publishes are nacked at once; the channel stays open.
    try:
        ch.basic_publish("", q, b"later", PERSISTENT)
        raise AssertionError("a persistent publish confirmed by a failed journal")
    except pika.exceptions.NackError:
        pass
    conn.close()
    # Every confirmed message is still there, through another broker, once.
    # (A nack refuses responsibility: the nacked ones may be delivered too,
    # as RabbitMQ may.)
    got = read_all(a, q)
    assert got[:len(confirmed)] == confirmed, (len(got), len(confirmed))
    assert set(got[len(confirmed):]) <= {nacked, b"later"}, len(got)


def cleanup(failed):
    problems = []
    for cluster in clusters:
        cluster.failed = failed
        problems += cluster.close()
    for path in mounts:
        subprocess.run(["umount", "-l", path], check=False)
    return problems


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("# needs root (mount -t tmpfs); CI runs as root")
        sys.exit(77)
    run(cleanup=cleanup)
