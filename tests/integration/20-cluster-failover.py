"""Goal: a queue with a backup survives the death of its primary with every
confirmed message, transient ones included: the backup holds a copy of each
message before the publisher's confirm, the controller promotes it when the
primary dies, and clients of the surviving brokers go on reading and
publishing through the new primary.

Method: three quayd processes (tests/cluster/clustertest.py). A queue with
x-quay-backups=1; a confirming publisher and a consumer (manual acks,
prefetch) on the two brokers that are not its primary; kill -9 of the
primary in the middle; the consumer (re-subscribed after the cancel
notification, as clients do) must end with every confirmed message, the
unacked ones marked redelivered. /api/queues shows where the copies are.
"""
import functools
import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, connect, declare_until, kill_at, queue_info,  # noqa: E402
                         read_all, run, test, wait_until)
from quaytest import eq  # noqa: E402

import pika  # noqa: E402

cluster = None
members = {}
state = {}


def start_again(member, what):
    """Starts member (killed) again and waits until every member's view has
    it up."""
    member.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(member.name) == "up"
                           for m in members.values()), 20, what=what)


def asked_as_the_primary_dies(primary, asks):
    """Runs each of asks ({key: function}) in a thread of its own while
    primary is frozen (SIGSTOP), checks that none was answered, then kills
    the primary: {key: what the function returned, or its exception as
    text} once every one is done."""
    answers = {}

    def ask(key, f):
        try:
            answers[key] = f()
        except Exception as e:  # (the caller's assertion shows it)
            answers[key] = "%s: %r" % (type(e).__name__, e)
    primary.proc.send_signal(signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=ask, args=item) for item in asks.items()]
        for t in threads:
            t.start()
        time.sleep(0.5)  # asked, unanswered
        assert answers == {}, answers
    finally:
        primary.kill()
    for t in threads:
        t.join(30)
    return answers


@test(timeout=120)
def three_brokers():
    global cluster
    cluster = Cluster()
    for m in cluster.form(["a", "b", "c"]):
        members[m.name] = m


@test(timeout=120)
def a_backup_holds_every_confirmed_message():
    c = connect(members["a"])
    ch = c.channel()
    ch.queue_declare("mirrored", arguments={"x-quay-backups": 1})
    c.close()
    info = queue_info(members["a"], "mirrored")
    assert len(info["backups"]) == 1 and info["in_sync"] == info["backups"], info
    assert info["backups"][0] != info["primary"], info
    backup = members[info["backups"][0]]
    publisher = [m for m in members.values() if m.name not in (info["primary"], backup.name)]
    c = connect(publisher[0])
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(500):
        ch.basic_publish("", "mirrored", b"%d" % i)
    c.close()
    # Confirmed means on the backup too (transient messages, in memory).
    assert queue_info(backup, "mirrored")["replica_messages"] == 500
    # Acks reach the backup (they may trail the client's ack by a moment).
    c = connect(publisher[0])
    ch = c.channel()
    for _ in range(100):
        m, _, _ = ch.basic_get("mirrored", auto_ack=False)
        ch.basic_ack(m.delivery_tag)
    c.close()
    wait_until(lambda: queue_info(backup, "mirrored")["replica_messages"] == 400, 5,
               what="the backup to drop the acked messages")


@test(timeout=120)
def the_backup_takes_over_and_consumers_go_on():
    info = queue_info(members["a"], "mirrored")
    primary = members[info["primary"]]
    backup = members[info["backups"][0]]
    other = [m for m in members.values() if m not in (primary, backup)][0]
    # A consumer on the third broker holds 20 unacked messages when the
    # primary dies. Its proxy re-attaches it to the new primary: the
    # client sees redeliveries, nothing else.
    con = connect(other)
    cch = con.channel()
    cch.basic_qos(prefetch_count=20)
    got = []
    cancelled = []
    cch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    held_tags = []
    cch.basic_consume("mirrored", lambda c_, m, p, b: (got.append((b, m.redelivered)),
                                                      held_tags.append(m.delivery_tag)))
    deadline = time.monotonic() + 5
    while len(got) < 20 and time.monotonic() < deadline:
        con.process_data_events(time_limit=0.1)
    assert len(got) == 20, got
    held = [int(b) for b, _ in got]
    got.clear()
    t0 = primary.kill()
    wait_until(lambda: queue_info(other, "mirrored")["primary"] == backup.name, 10,
               what="the backup promoted")
    print("# promoted %.2f s after kill -9 of the primary" % (time.monotonic() - t0))
    # /api/cluster counts each broker's share: the dead broker serves none,
    # the promoted backup is a primary (the only queue so far is this one).
    shares = {b["name"]: b for b in other.api_cluster()["brokers"]}
    assert shares[primary.name]["primaries"] == shares[primary.name]["unavailable"], shares
    assert shares[backup.name]["primaries"] == 1, shares
    # Acks of deliveries from the dead primary go nowhere (it requeued
    # them by dying); the consumer just goes on.
    cch.basic_ack(held_tags[-1], multiple=True)
    pub = connect(other)
    pch = pub.channel()
    pch.confirm_delivery()
    pch.basic_publish("", "mirrored", b"after")  # through the new primary
    pub.close()

    def on_message(ch_, m, p, b):
        got.append((b, m.redelivered))
        ch_.basic_ack(m.delivery_tag)
    cch.basic_cancel(cch.consumer_tags[0])
    cch.basic_consume("mirrored", on_message)
    deadline = time.monotonic() + 10
    while len(got) < 401 and time.monotonic() < deadline:
        con.process_data_events(time_limit=0.1)
    con.close()
    bodies = [b for b, _ in got]
    # Everything confirmed and not acked before the kill: 100..499, then
    # the message published after the failover.
    assert sorted(int(b) for b in bodies if b != b"after") == list(range(100, 500)), \
        (len(bodies), bodies[:5])
    assert b"after" in bodies
    assert all(r for b, r in got if b != b"after" and int(b) in held), "held ones redelivered"
    assert not cancelled, "the consumer was cancelled instead of re-attached"
    start_again(primary, "the old primary back")


@test(timeout=120)
def publishers_elsewhere_see_no_error_across_a_failover():
    # A fresh queue with two backups; a confirming publisher on a broker
    # that is not its primary keeps publishing while the primary dies.
    c = connect(members["a"])
    c.channel().queue_declare("steady", arguments={"x-quay-backups": 2})
    c.close()
    info = queue_info(members["a"], "steady")
    primary = members[info["primary"]]
    assert primary.alive()
    other = [m for m in members.values() if m is not primary][0]
    pub = connect(other)
    ch = pub.channel()
    ch.confirm_delivery()
    confirmed = 0
    killed_at = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4:
        ch.basic_publish("", "steady", b"%d" % confirmed)  # raises on a nack
        confirmed += 1
        if killed_at is None and time.monotonic() - t0 > 1:
            killed_at = primary.kill()
    pub.close()
    print("# %d confirmed, none rejected, across kill -9 of the primary" % confirmed)
    wait_until(lambda: queue_info(other, "steady")["primary"] != primary.name, 10)
    seen = set(int(body) for body in read_all(other, "steady"))
    missing = set(range(confirmed)) - seen
    assert not missing, "%d confirmed messages lost" % len(missing)
    start_again(primary, "the old primary back")


@test(timeout=120)
def the_factor_is_restored_and_a_second_failover_keeps_everything():
    # A queue with one backup and messages (some delivered, not acked).
    c = connect(members["a"])
    ch = c.channel()
    ch.queue_declare("twice", arguments={"x-quay-backups": 1})
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", "twice", b"%d" % i)
    c.close()
    first = queue_info(members["a"], "twice")
    primary = members[first["primary"]]
    watcher = [m for m in members.values() if m is not primary][0]
    primary.kill()
    # Promoted, and a new backup chosen, caught up and back in sync.
    wait_until(lambda: (lambda q: q["primary"] != primary.name and len(q["in_sync"]) == 1)(
        queue_info(watcher, "twice")), 15, what="the factor restored")
    second = queue_info(watcher, "twice")
    backup = members[second["in_sync"][0]]
    assert backup.alive(), second
    wait_until(lambda: queue_info(backup, "twice")["replica_messages"] == 300, 5,
               what="the new backup to hold all 300")
    start_again(primary, "the first primary back")
    # Now the second primary dies: the caught-up backup has everything.
    new_primary = members[second["primary"]]
    new_primary.kill()
    survivor = [m for m in members.values() if m is not new_primary and m.alive()][0]
    wait_until(lambda: queue_info(survivor, "twice")["primary"] == backup.name, 10,
               what="the caught-up backup promoted")
    got = set(int(body) for body in read_all(survivor, "twice"))
    assert got == set(range(300)), "%d of 300 after two failovers" % len(got)
    start_again(new_primary, "the second primary back")


@test(timeout=120)
def a_purge_holds_on_the_backup_and_across_a_failover():
    # A purge is told to the backups (and the log) as runs of consecutive
    # ready seqs: those handed out and not acked stay, on both copies. A
    # priority queue's levels interleave (its runs are found across them),
    # and basic.get takes its highest first: the unacked are scattered.
    for name, args in (("purged", {}), ("purged-prio", {"x-max-priority": 3})):
        c = connect(members["a"])
        ch = c.channel()
        ch.queue_declare(name, durable=True, arguments=dict(args, **{"x-quay-backups": 1}))
        c.close()
        info = queue_info(members["a"], name)
        primary = members[info["primary"]]
        backup = members[info["backups"][0]]
        client = [m for m in members.values() if m not in (primary, backup)][0]
        c = connect(client)
        ch = c.channel()
        ch.confirm_delivery()
        # (More than a backup drops a slot at a time: replica.c's tail.)
        for i in range(3000):  # every third transient: they are in no log
            ch.basic_publish("", name, b"%d" % i, pika.BasicProperties(
                delivery_mode=1 if i % 3 == 0 else 2, priority=i % 3))
        holder = connect(client)
        hch = holder.channel()
        held = [hch.basic_get(name, auto_ack=False) for _ in range(5)]
        hch.basic_nack(held[2][0].delivery_tag, requeue=True)  # back among the ready
        kept = sorted(int(h[2]) for k, h in enumerate(held) if k != 2)
        eq(ch.queue_purge(name).method.message_count, 3000 - 4)
        ch.basic_publish("", name, b"after", pika.BasicProperties(delivery_mode=2))
        wait_until(lambda: queue_info(backup, name)["replica_messages"] == 4 + 1, 5,
                   what="the backup to hold the 4 unacked and the one after, of %s" % name)
        primary.kill()
        holder.close()  # (its connection's broker returns them: now to the new primary)
        wait_until(lambda: queue_info(client, name)["primary"] == backup.name, 10,
                   what="the backup promoted")
        got = read_all(client, name, redelivered=True)
        c.close()
        eq(sorted(int(b) for b, _ in got if b != b"after"), kept,
           "only the unacked ones and the one after came back, of %s" % name)
        eq(sum(1 for b, _ in got if b == b"after"), 1)
        start_again(primary, "the old primary back")


@test(timeout=120)
def bindings_survive_a_promotion():
    c = connect(members["a"])
    ch = c.channel()
    ch.queue_declare("bound", arguments={"x-quay-backups": 1})
    ch.queue_bind("bound", "amq.topic", "k.#")
    c.close()
    info = queue_info(members["a"], "bound")
    primary = members[info["primary"]]
    backup = members[info["backups"][0]]
    primary.kill()
    wait_until(lambda: queue_info(backup, "bound")["primary"] == backup.name, 10,
               what="the backup promoted")
    # Published on the new primary itself, through the exchange.
    c = connect(backup)
    ch = c.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "k.x", b"routed", mandatory=True)  # raises if returned
    m, _, body = ch.basic_get("bound", auto_ack=True)
    assert body == b"routed", body
    c.close()
    start_again(primary, "the old primary back")


@test(timeout=180)
def a_promoted_durable_queue_keeps_its_persistent_messages_on_disk():
    # The backup logs the persistent messages (and their acks) as the
    # primary does, and a promotion hands that log to the new primary:
    # after a crash of the whole cluster, the new primary's disk has
    # exactly the persistent messages nobody acked, those published after
    # the promotion included. (Transient ones live in memory only.)
    c = connect(members["a"])
    ch = c.channel()
    ch.queue_declare("logged", durable=True, arguments={"x-quay-backups": 1})
    c.close()
    # (The previous test restarted a broker: let the new queue's backup be
    # in sync before publishing, so every confirm means it has the message.)
    wait_until(lambda: (lambda q: q["in_sync"] == q["backups"] != [])(
        queue_info(members["a"], "logged")), 15, what="the backup in sync")
    info = queue_info(members["a"], "logged")
    primary, backup = members[info["primary"]], members[info["backups"][0]]
    other = [m for m in members.values() if m not in (primary, backup)][0]
    c = connect(other)
    ch = c.channel()
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(300):
        ch.basic_publish("", "logged", b"%d" % i, properties=persistent)
    for i in range(300, 350):
        ch.basic_publish("", "logged", b"%d" % i)
    for _ in range(100):
        m, _, body = ch.basic_get("logged", auto_ack=False)
        ch.basic_ack(m.delivery_tag)
    c.close()
    deadline = time.monotonic() + 15
    while queue_info(backup, "logged")["replica_messages"] != 250:
        assert time.monotonic() < deadline, ("the backup still holds", queue_info(backup, "logged"))
        time.sleep(0.05)
    primary.kill()
    wait_until(lambda: (queue_info(other, "logged") or {}).get("primary") == backup.name, 10,
               what="the backup promoted")
    c = connect(other)
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(1000, 1020):
        ch.basic_publish("", "logged", b"%d" % i, properties=persistent)
    c.close()
    for m in (backup, other):
        m.kill()
    for m in (primary, backup, other):
        m.start(wait=False)
    for m in (primary, backup, other):
        m.wait_accepting()
    wait_until(lambda: all(m.view() and set(m.view().brokers.values()) == {"up"}
                           for m in members.values()), 30, what="the whole cluster back")
    wait_until(lambda: (queue_info(other, "logged") or {}).get("available"), 15,
               what="the queue available again")
    assert queue_info(other, "logged")["primary"] == backup.name
    got = [int(body) for body in read_all(other, "logged")]
    assert got == list(range(100, 300)) + list(range(1000, 1020)), got


@test(timeout=180)
def a_paged_queue_gets_a_new_backup_caught_up_while_it_serves():
    # A lazy queue keeps its messages on disk only; a new backup is caught
    # up from the journal, a window at a time, while the queue goes on
    # taking publishes and acks; once in sync it holds exactly what the
    # queue does, and takes over with all of it.
    c = connect(members["a"])
    ch = c.channel()
    ch.queue_declare("lazy", durable=True,
                     arguments={"x-quay-backups": 1, "x-queue-mode": "lazy"})
    c.close()
    info = queue_info(members["a"], "lazy")
    primary, backup = members[info["primary"]], members[info["backups"][0]]
    other = [m for m in members.values() if m not in (primary, backup)][0]
    persistent = pika.BasicProperties(delivery_mode=2)
    pad = b"." * 1000
    c = connect(primary)
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(3000):
        ch.basic_publish("", "lazy", b"%d " % i + pad, properties=persistent)
    assert queue_info(primary, "lazy")["paged"] == 3000
    backup.kill()
    # Meanwhile: more publishes, and the oldest 100 consumed.
    for i in range(3000, 3500):
        ch.basic_publish("", "lazy", b"%d " % i + pad, properties=persistent)
    for _ in range(100):
        m, _, body = ch.basic_get("lazy", auto_ack=False)
        ch.basic_ack(m.delivery_tag)
    c.close()
    wait_until(lambda: (lambda q: q["in_sync"] == [other.name])(queue_info(primary, "lazy")),
               20, what="the third broker caught up and in sync")
    assert queue_info(other, "lazy")["replica_messages"] == 3400
    backup.start()  # (two of three up: a majority to promote with)
    wait_until(lambda: all(m.view() and m.view().brokers.get(backup.name) == "up"
                           for m in (primary, other)), 20, what="the old backup back")
    primary.kill()
    wait_until(lambda: (queue_info(other, "lazy") or {}).get("primary") == other.name, 10,
               what="the caught-up backup promoted")
    # The backup kept them as its primary did: on disk only, paged.
    assert queue_info(other, "lazy")["paged"] == 3400, queue_info(other, "lazy")
    got = [int(body.split()[0]) for body in read_all(other, "lazy")]
    assert got == list(range(100, 3500)), (len(got), got[:5], got[-5:])
    primary.start()
    wait_until(lambda: all(m.view() and set(m.view().brokers.values()) == {"up"}
                           for m in members.values()), 30, what="all three back")


@test(timeout=120)
def requests_in_flight_through_stand_ins_outlive_their_primary():
    """basic.get and a passive queue.declare asked through stand-ins while
    the queue's primary is frozen (SIGSTOP), which is then killed: on one
    broker they would be answered, and so they are here, by the promoted
    backup once the map names it. The third broker's stand-in asks again
    when its link falls (or the failover moves the queue); the backup's was
    replaced by the real queue meanwhile, and its channels ask again by
    name. Before, every one was refused with 404 "its primary broker cannot
    be reached" the moment the link fell."""
    c = connect(members["a"])
    ch = c.channel()
    ch.queue_declare("inflight", arguments={"x-quay-backups": 1})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", "inflight", b"%d" % i)
    c.close()
    info = queue_info(members["a"], "inflight")
    assert len(info["in_sync"]) == 1, info
    primary, backup = members[info["primary"]], members[info["in_sync"][0]]
    proxy = next(m for m in members.values() if m.name not in (primary.name, backup.name))
    askers = [(m, kind) for m in (proxy, backup) for kind in ("get", "declare")]
    conns = [connect(m) for m, _ in askers]
    channels = [conn.channel() for conn in conns]

    def get(ch):
        method, _, body = ch.basic_get("inflight", auto_ack=True)
        return int(body) if method is not None else "empty"

    def declare(ch):
        return ch.queue_declare("inflight", passive=True).method.message_count
    answers = asked_as_the_primary_dies(primary, {
        i: functools.partial(get if kind == "get" else declare, ch)
        for i, ((_, kind), ch) in enumerate(zip(askers, channels))})
    for conn in conns:
        if conn.is_open:  # (a refusal closed its channel, not it)
            conn.close()
    named = {"%s %s" % (m.name, kind): answers.get(i) for i, (m, kind) in enumerate(askers)}
    gets = [answers.get(i) for i, (_, kind) in enumerate(askers) if kind == "get"]
    assert all(isinstance(a, int) for a in answers.values()) and len(answers) == 4, named
    assert sorted(gets) == [0, 1], named  # each message once, in order
    assert all(8 <= named["%s declare" % m.name] <= 10 for m in (proxy, backup)), named
    start_again(primary, "the old primary back")


@test(timeout=120)
def a_transaction_committed_as_its_primary_dies_commits_once():
    """tx.commit through the backup and through the third broker while the
    queue's primary is frozen (SIGSTOP), which is then killed: the publishes
    the backup's stand-in held are its own when it is promoted, and those
    the third broker forwarded go to the new primary; both commits are
    answered commit-ok, and the queue holds each message once. Before, the
    promoted backup took its held transactional publishes for confirms and
    failed an assertion (channel.c sink_wait)."""
    c = connect(members["a"])
    c.channel().queue_declare("tx-failover", arguments={"x-quay-backups": 1})
    c.close()
    info = queue_info(members["a"], "tx-failover")
    primary = members[info["primary"]]
    vias = [m for m in members.values() if m is not primary]
    conns = [connect(m) for m in vias]
    channels = [conn.channel() for conn in conns]
    for via, ch in zip(vias, channels):
        ch.tx_select()
        for i in range(5):
            ch.basic_publish("", "tx-failover", b"%s-%d" % (via.name.encode(), i))
    def commit(ch):
        ch.tx_commit()
        return "commit-ok"
    answers = asked_as_the_primary_dies(primary, {
        via.name: functools.partial(commit, ch) for via, ch in zip(vias, channels)})
    for conn in conns:
        if conn.is_open:
            conn.close()
    assert answers == {m.name: "commit-ok" for m in vias}, answers
    assert all(m.alive() for m in vias), "a broker died"
    got = sorted(read_all(vias[0], "tx-failover"))
    assert got == sorted(b"%s-%d" % (m.name.encode(), i) for m in vias for i in range(5)), got
    start_again(primary, "the old primary back")


@test(timeout=240)
def a_backup_killed_as_it_is_promoted_comes_back_with_its_replica():
    # The map promotes a durable queue's backup; the backup dies before it
    # makes the queue real (gdb kills it on the promotion's first step),
    # and comes back as a new process that the map names the primary.
    # Its replica was in memory and in its replica log: a restart deleted
    # that log (no queue was defined for it) and the promoted broker served
    # the queue empty, while every confirmed message had been in it (tests/
    # sim: the --strict seeds 5, 27, 61, 207, 257 and 353). The log is
    # defined as a replica's now, recovered as a queue held until the sync,
    # and served by the broker the present map makes primary.
    trio_cluster = state["trio"] = Cluster()
    trio = {m.name: m for m in trio_cluster.form(["x", "y", "z"])}
    leader = trio["x"]  # (the first one leads)
    # Primary and backup both not the leader: the leader and the backup are
    # the majority that commits the promotion once the primary is dead.
    name = declare_until("promoted", leader,
                         lambda q: q is not None and leader.name not in
                         [q["primary"]] + q["backups"], **{"x-quay-backups": 1})
    c = connect(leader)
    ch = c.channel()
    for k in range(64):  # (the misses go: ours is the only queue promoted)
        if "promoted-%d" % k != name:
            ch.queue_delete("promoted-%d" % k)
    c.close()
    wait_until(lambda: (lambda q: q["in_sync"] == q["backups"] != [])(queue_info(leader, name)),
               15, what="the backup in sync")
    info = queue_info(leader, name)
    primary, backup = trio[info["primary"]], trio[info["backups"][0]]
    c = connect(leader)
    ch = c.channel()
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(50):
        ch.basic_publish("", name, b"%d" % i, properties=persistent)
    c.close()
    wait_until(lambda: (queue_info(backup, name) or {}).get("replica_messages") == 50, 10,
               what="the backup to hold the 50 messages")
    time.sleep(0.5)  # (its log written: the journal's writer thread)
    gdb = state["gdb"] = kill_at(backup, "proxy_stub_take_replica")
    primary.kill()
    out = gdb.communicate(timeout=90)[0]
    assert "proxy_stub_take_replica" in out and "killed" in out, out
    assert backup.proc.wait(10) == -9
    # The map (the leader's) names the dead backup the primary.
    assert queue_info(leader, name)["primary"] == backup.name, queue_info(leader, name)
    assert queue_info(leader, name)["messages"] == 0, queue_info(leader, name)  # (it is dead)
    seen = len(backup.log_text_bytes())
    backup.start()
    # Its restart recovers the replica's log as the queue (held until the
    # sync); the map then has it serve them (or, having marked it down
    # meanwhile, fails the queue over to the backup it caught up).
    def settled():
        q = queue_info(leader, name) or {}
        return (q.get("available") and q.get("messages") == 50 and
                q.get("primary") in (leader.name, backup.name))
    wait_until(settled, 30, what="the queue served again with its 50 messages",
               detail=lambda: queue_info(leader, name))
    time.sleep(1)
    wait_until(settled, 30, what="the queue still served", detail=lambda: queue_info(leader, name))
    got = read_all(leader, name, redelivered=True)
    assert [int(body) for body, _ in got] == list(range(50)), got
    assert all(flag for _, flag in got), "a replica's messages come back flagged redelivered"
    assert b"1 queues, 0 bindings, 50 messages" in backup.log_text_bytes()[seen:]



@test(timeout=120)
def a_backup_started_without_its_cluster_drops_its_replica():
    # A durable queue's backup defines its replica log as a replica's (see
    # above). Started from that data directory without cluster options, the
    # broker has no map to say whose queue it is and drops it: the
    # definition undefined (once the definitions' replay is over: it walks
    # the entries an undefine frees) and the log deleted, for good: a second
    # standalone start finds neither.
    duo_cluster = state["duo"] = Cluster()
    duo = {m.name: m for m in duo_cluster.form(["p", "q"])}
    p = duo["p"]
    name = declare_until("dropped", p, lambda q: q is not None and q["primary"] == "p" and
                         q["backups"] == ["q"], **{"x-quay-backups": 1})
    wait_until(lambda: queue_info(p, name)["in_sync"] == ["q"], 15, what="q in sync")
    c = connect(p)
    ch = c.channel()
    for k in range(64):  # (the misses go)
        if "dropped-%d" % k != name:
            ch.queue_delete("dropped-%d" % k)
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(20):
        ch.basic_publish("", name, b"%d" % i, properties=persistent)
    c.close()
    backup = duo["q"]
    wait_until(lambda: (queue_info(backup, name) or {}).get("replica_messages") == 20, 10,
               what="the backup to hold the 20 messages")
    time.sleep(0.5)  # (its log written: the journal's writer thread)
    assert backup.stop() == 0
    backup.options = lambda: []  # (standalone from now on)
    for run_index, dropped in enumerate([21, 0]):  # the definition and its 20 messages
        seen = len(backup.log_text_bytes())
        backup.start()
        text = backup.log_text_bytes()[seen:]
        assert b"0 queues, 0 bindings, 0 messages" in text, text[-2000:]
        assert b"(%d records dropped)" % dropped in text, (run_index, text[-2000:])
        c = connect(backup)
        try:
            c.channel().queue_declare(name, durable=True, passive=True)
            raise AssertionError("%s still declared on a standalone broker" % name)
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404, e
        c.close()
        assert backup.stop() == 0


def cleanup(failed):
    gdb = state.get("gdb")
    if gdb is not None and gdb.poll() is None:
        gdb.kill()
        gdb.wait()
    problems = []
    for c in (state.get("duo"), state.get("trio"), cluster):
        if c is not None:
            c.failed = failed
            problems += c.close() or []
    return problems


if __name__ == "__main__":
    run(cleanup)
