"""Goal: a backup that stops answering leaves the queue's in-sync set by a
map change before the primary confirms without it, is never promoted while
it may lack confirmed messages, and is caught up and back in sync once it
answers again; the queue's replication factor is restored.

Method: five quayd processes (tests/cluster/clustertest.py; five, so that a
majority survives one broker stopped and another killed). A queue with
x-quay-backups=2. One backup is frozen with SIGSTOP (alive to the kernel:
its connections stay open, nothing answers). A confirming publisher on a
fourth broker must see its confirms resume, and /api/queues must show the
frozen backup out of sync. Then the primary is killed with kill -9: the
in-sync backup is promoted, never the frozen one, and every confirmed
message is read back. SIGCONT: the frozen broker comes back and the queue
is back at two in-sync backups. Last, on three other brokers, a backup
restarted while the map could not mark it down is caught up before it is
in sync again, and a primary restarted so hands its queue to its in-sync
backup rather than serve what its journal recovered.
"""
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, declare_until, publish_half_transient, queue_info,  # noqa: E402
                         read_all, restart_without_quorum, run, test, wait_until)

import pika  # noqa: E402

cluster = None
members = {}
QUEUE = "lagging"
IDLE = "idle"
state = {}


def connect(member):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", member.amqp_port, heartbeat=0, blocked_connection_timeout=60))


def publish(member, first, count):
    """Publishes first..first+count-1 with confirms; returns the confirmed
    numbers (pika's BlockingChannel raises on a nack)."""
    c = connect(member)
    ch = c.channel()
    ch.confirm_delivery()
    done = []
    for i in range(first, first + count):
        ch.basic_publish("", QUEUE, b"%d" % i)
        done.append(i)
    c.close()
    return done


@test(timeout=120)
def five_brokers():
    global cluster
    cluster = Cluster()
    for m in cluster.form(["a", "b", "c", "d", "e"]):
        members[m.name] = m
    c = connect(members["a"])
    c.channel().queue_declare(QUEUE, arguments={"x-quay-backups": 2})
    # Never published to: its new backups are caught up by an empty probe.
    c.channel().queue_declare(IDLE, arguments={"x-quay-backups": 2})
    c.close()
    wait_until(lambda: len((queue_info(members["a"], QUEUE) or {}).get("in_sync", [])) == 2, 10,
               what="two backups in sync")


@test(timeout=120)
def a_frozen_backup_leaves_the_in_sync_set_first():
    info = queue_info(members["a"], QUEUE)
    primary = members[info["primary"]]
    frozen, kept = members[info["backups"][1]], members[info["backups"][0]]
    others = [m for m in members.values() if m not in (primary, frozen, kept)]
    state.update(primary=primary, frozen=frozen, kept=kept, others=others)
    state["confirmed"] = publish(others[0], 0, 200)
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    state["confirmed"] += publish(others[0], 200, 300)
    print("# 300 publishes confirmed %.2f s after a backup froze" % (time.monotonic() - t0))
    info = queue_info(primary, QUEUE)
    # The primary confirmed without it: the map no longer counts it in sync.
    assert frozen.name not in info["in_sync"], info
    assert kept.name in info["in_sync"], info
    assert info["serving"] is True and info["confirms"]["count"] >= 300, info


@test(timeout=120)
def the_in_sync_backup_is_promoted_never_the_frozen_one():
    primary, frozen, kept = state["primary"], state["frozen"], state["kept"]
    observer = state["others"][0]
    primary.kill()
    wait_until(lambda: (queue_info(observer, QUEUE) or {}).get("primary") == kept.name, 15,
               what="the in-sync backup to be promoted")
    assert frozen.alive() and queue_info(observer, QUEUE)["primary"] != frozen.name
    c = connect(observer)
    ch = c.channel()
    got = set()
    deadline = time.monotonic() + 20
    while len(got) < len(state["confirmed"]) and time.monotonic() < deadline:
        m, _, body = ch.basic_get(QUEUE, auto_ack=True)
        if m is None:
            time.sleep(0.05)
            continue
        got.add(int(body))
    c.close()
    lost = set(state["confirmed"]) - got
    assert not lost, "lost %d confirmed messages, e.g. %s" % (len(lost), sorted(lost)[:5])


@test(timeout=120)
def thawed_and_restarted_the_factor_is_restored():
    frozen, kept, primary = state["frozen"], state["kept"], state["primary"]
    os.kill(frozen.proc.pid, signal.SIGCONT)
    primary.restart()
    wait_until(lambda: all(m.view() and m.view().brokers.get(frozen.name) == "up"
                           and m.view().brokers.get(primary.name) == "up"
                           for m in members.values()), 30,
               what="the thawed and the restarted broker up everywhere")
    publish(state["others"][0], 1000, 100)
    t0 = time.monotonic()

    def restored():
        info = queue_info(kept, QUEUE) or {}
        return len(info.get("backups", [])) == 2 and info.get("in_sync") == info["backups"]
    wait_until(restored, 30, what="two in-sync backups again")

    def idle_restored():
        info = queue_info(kept, IDLE) or {}
        return len(info.get("backups", [])) == 2 and info.get("in_sync") == info["backups"]
    wait_until(idle_restored, 30, what="the idle queue's two backups in sync again")
    print("# factor restored %.2f s after both were back" % (time.monotonic() - t0))
    info = queue_info(kept, QUEUE)
    for name in info["backups"]:
        wait_until(lambda: (queue_info(members[name], QUEUE) or {}).get("replica_messages")
                   == info["messages"], 10,
                   what="%s to hold every message" % name)


@test(timeout=120)
def a_backup_restarted_at_once_is_caught_up_before_it_is_in_sync_again():
    """A backup killed and restarted while the map could not mark it down
    (no quorum meanwhile: it led, and another broker is stopped) comes
    back as a new process holding none of the queue (a replica is not kept
    across a restart). The primary's stream to it saw no failure (nothing
    was in flight), and the new process takes newer pushes. The map drops
    it from the in-sync set when it hears the new process
    (broker.incarnation); the primary must catch it up before asking to
    put it back. Before, it asked at once, and the map counted an empty
    replica in sync (tests/sim seed 281609694 found it; this test then saw
    the backup in sync holding 0 of 100 messages)."""
    small = state["small"] = Cluster()
    trio = {m.name: m for m in small.form(["x", "y", "z"])}
    leader = trio["x"]  # (the first one leads)
    # A queue whose primary is not the Raft leader, which is its backup
    # (three brokers, two backups). Were the dead broker marked down, its
    # backups would be dropped and it would come back as a new one.
    c = connect(leader)
    ch = c.channel()
    for k in range(12):
        ch.queue_declare("restarted-%d" % k, arguments={"x-quay-backups": 2})
    name = next(n for n in ("restarted-%d" % k for k in range(12))
                if queue_info(leader, n)["primary"] != leader.name)
    wait_until(lambda: len((queue_info(leader, name) or {}).get("in_sync", [])) == 2, 10,
               what="two backups in sync")
    ch.confirm_delivery()
    for i in range(100):
        ch.basic_publish("", name, b"%d" % i)
    c.close()
    info = queue_info(leader, name)
    primary, backup = trio[info["primary"]], leader
    assert info["messages"] == 100, info
    seen = len(primary.log_text_bytes())
    back_in_sync = ("event=backup_in_sync vhost=/ queue=%s broker=%s " % (name, backup.name)
                    ).encode()
    other = next(m for m in trio.values() if m not in (primary, backup))
    restart_without_quorum(backup, other)
    # The map change that puts it back in sync (after the ones that took it
    # out), as the primary logs it.
    wait_until(lambda: back_in_sync in primary.log_text_bytes()[seen:], 30,
               what="the restarted backup back in sync")
    assert backup.name in queue_info(primary, name)["backups"]
    wait_until(lambda: (queue_info(backup, name) or {}).get("replica_messages") == 100, 5,
               what="the backup, in sync again, to hold the queue's 100 messages",
               detail=lambda: (queue_info(backup, name) or {}).get("replica_messages"))


def restarted_primary_hands_over(prefix, durable):
    """A queue with one backup whose primary is the Raft leader gets 100
    confirmed messages, half of them transient; the primary is killed and
    restarted while the map cannot mark it down (restart_without_quorum).
    Every message must then be read from the queue's new primary, its
    backup: the transient ones were in the dead process's memory only, and
    in the backup."""
    small = state["small"]
    trio = {m.name: m for m in small.members}
    leader = trio["x"]  # (the first one leads)
    name = declare_until(prefix, leader, lambda q: q["primary"] == leader.name, durable=durable,
                         **{"x-quay-backups": 1})
    c = connect(leader)
    ch = c.channel()
    wait_until(lambda: len((queue_info(leader, name) or {}).get("in_sync", [])) == 1, 10,
               what="its backup in sync")
    backup = trio[queue_info(leader, name)["backups"][0]]
    other = next(m for m in trio.values() if m not in (leader, backup))
    ch.confirm_delivery()
    want = publish_half_transient(ch, name, 100)
    c.close()
    restart_without_quorum(leader, other)
    wait_until(lambda: (queue_info(other, name) or {}).get("primary") == backup.name, 30,
               what="the queue handed to %s" % backup.name,
               detail=lambda: queue_info(other, name))
    # Usually the restarted broker hands it over; under load the map may
    # see it down first (its new links reset as it comes back), and a
    # failover promotes the same backup: either way nothing is lost.
    handed = "we restarted, and its in-sync backup %s holds what our journal could not" % (
        backup.name) in leader.log_text()
    print("# %s" % ("handed over by the restarted primary" if handed else
                    "failed over: the map saw the primary down first"))
    got = read_all(other, name)
    assert got == want, (len(got), got[:4])


@test(timeout=120)
def a_primary_restarted_at_once_hands_its_queue_to_its_in_sync_backup():
    """A durable queue: the restarted primary's journal gives it back the
    persistent messages only. Once caught up with the map, which still
    names it the primary, it hands the queue to its in-sync backup
    (queue.set_owner) rather than serve what it recovered. Before, it
    served the queue and its first act was to catch the backup up,
    resetting its copy to the persistent half (50 of 100)."""
    restarted_primary_hands_over("handed", durable=True)


@test(timeout=120)
def a_non_durable_queue_whose_primary_restarted_at_once_goes_to_its_backup():
    """A non-durable queue: the restarted primary recovered nothing of it,
    and the map's log it replays made it again, empty. It must not serve
    that (whose first act was to catch its backup up, emptying it), nor
    delete the queue as a transient queue that died with its broker (it
    did not: its backup holds it): it hands the queue to its in-sync
    backup, as a failover would have. Before, the queue was deleted."""
    restarted_primary_hands_over("handed-transient", durable=False)


@test(timeout=120)
def a_non_durable_queue_without_backups_goes_with_its_restarted_primary():
    """A non-durable queue with no backup, on the broker that restarts
    (killed and restarted while the map cannot mark it down): nothing of
    it survived, and it goes, as RabbitMQ's transient queue goes with its
    node. The restarted broker deletes it from the map once it caught up;
    a client of another broker then gets 404 for it."""
    small = state["small"]
    trio = {m.name: m for m in small.members}
    leader = trio["x"]  # (the first one leads)
    name = declare_until("alone-transient", leader, lambda q: q["primary"] == leader.name,
                         durable=False, **{"x-quay-backups": 0})
    c = connect(leader)
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", name, b"%d" % i)
    c.close()
    others = [m for m in trio.values() if m is not leader]
    restart_without_quorum(leader, others[0])
    wait_until(lambda: queue_info(others[1], name) is None, 30,
               what="the queue deleted from the map", detail=lambda: queue_info(others[1], name))
    assert "transient queue '%s' did not survive our restart" % name in leader.log_text()
    c = connect(others[1])
    try:
        c.channel().queue_declare(name, passive=True)
        raise AssertionError("the queue is still there for a client")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
    finally:
        c.close()


def cleanup(failed):
    frozen = state.get("frozen")
    if frozen is not None and frozen.alive():
        os.kill(frozen.proc.pid, signal.SIGCONT)
    problems = []
    for c in (state.get("small"), cluster):
        if c is not None:
            c.failed = failed
            problems += c.close() or []
    return problems


if __name__ == "__main__":
    run(cleanup)
