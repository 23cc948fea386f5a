"""Goal: with --shared-storage, a durable queue with no backup survives the
death of its broker: a live broker sharing the storage takes its log over
(every confirmed persistent message, the delivered and unacked ones
redelivered; transient messages are lost, as documented), clients go on
using it by name through any broker, the old broker restarted does not
touch the taken-over logs, and a cut-off owner that resumes (SIGSTOP, then
SIGCONT) cannot confirm anything through the log it lost (the fence).

Method: three quayd processes (tests/cluster/clustertest.py) on one shared
directory; queues with x-quay-backups=0 on broker c; confirmed persistent
publishes and a few gets left unacked; kill -9 of c; the map (/api/queues)
says where each queue went; the messages are read back through another
broker. Then SIGSTOP of the owner of another queue while a publisher waits
on its confirms, takeover, SIGCONT: the old owner's log says it was fenced,
and every message it confirmed is readable exactly once from the new owner.
A log that cannot be read whole keeps its queue unavailable (never served
without its messages) until a later try reads it.
Also: the rebalancer, turned on at run time, gives the returned broker its
share back; two of five brokers killed at once are both taken over; a
taker whose journal thread is frozen (ptrace: its copy never synced) is
killed once it adopted, and its queues come back whole from the next
takers, or, with nobody to replace it, from itself restarted.
"""
import ctypes
import functools
import json
import math
import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, closer, connect, metric, publish_half_transient,  # noqa: E402
                         queue_info, read_all, restart_without_quorum, run, test, wait_until)

import pika  # noqa: E402

cluster = None
members = {}
shared = None
state = {}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def noting_failure(f):
    """A failed test keeps the logs of the first cluster, which the last
    test closes before it forms its own."""
    @functools.wraps(f)
    def run_it():
        try:
            f()
        except BaseException:
            state["failed"] = True
            raise
    return run_it


def place(via, prefix, owner, count):
    """Declares prefix-N (durable, no backups) through via until count of
    them have owner as primary; returns their names. (The ring keeps new
    queues off a broker at its share: after 64 the rest are moved there.)"""
    conn = connect(via)
    ch = conn.channel()
    names = []
    for i in range(64 + count):
        name = "%s-%d" % (prefix, i)
        ch.queue_declare(name, durable=True, arguments={"x-quay-backups": 0})
        info = queue_info(via, name)
        if info and info["primary"] != owner and i >= 64:
            status, body = via.api_call("POST", "/api/cluster/move", json.dumps(
                {"vhost": "/", "queue": name, "to": owner}).encode(), timeout=5)
            assert status == 202, (status, body)
            # (The switch keeps the old primary beyond the factor until the
            # new one applied it: map_queue_switch_keeps_primary. Until it
            # is released it holds what is published, in its own log.)
            wait_until(lambda: queue_info(via, name)["primary"] == owner and
                       queue_info(via, name)["backups"] == [], 20,
                       what="%s moved to %s, its old primary released" % (name, owner))
            info = queue_info(via, name)
        if info and info["primary"] == owner:
            names.append(name)
            if len(names) == count:
                break
    conn.close()
    assert len(names) == count, "placement gave %s only %d %s queues" % (owner, len(names),
                                                                        prefix)
    return names


def publish(member, queue, bodies, props=PERSISTENT):
    conn = connect(member)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, props)  # raises unless confirmed
    conn.close()


def drain(member, queue):
    """Every message left: (body, redelivered), acked."""
    conn = connect(member)
    ch = conn.channel()
    out = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            break
        out.append((body, m.redelivered))
    conn.close()
    return out


def queue_dirs(broker):
    """The queue names of a broker's journal on the shared storage (from
    each log's header file, which holds the queue's name)."""
    root = os.path.join(shared, broker, "queues")
    names = set()
    for d in os.listdir(root) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, d, "queue"), "rb") as f:
                header = f.read()
        except OSError:
            continue
        for name in state.get("all_names", []):
            if name.encode() in header:
                names.add(name)
    return names


@test(timeout=120)
@noting_failure
def three_brokers_share_one_directory():
    global cluster, shared
    cluster = Cluster()
    shared = os.path.join(cluster.dir, "shared")
    for m in cluster.form(["a", "b", "c"], extra_args=["--shared-storage", shared]):
        members[m.name] = m
    with open(os.path.join(shared, "storage-id")) as f:
        storage_id = f.read().strip()
    assert len(storage_id) == 32, storage_id
    for name in "abc":
        assert os.path.isdir(os.path.join(shared, name, "queues")), name
    # Every broker announced the same storage in the map.
    wait_until(lambda: all(b.get("storage") == storage_id
                           for b in members["a"].api_cluster()["brokers"]), 10,
               what="every broker's storage in the map")


@test(timeout=120)
@noting_failure
def a_dead_brokers_queues_are_taken_over_with_every_confirmed_message():
    a, b, c = members["a"], members["b"], members["c"]
    names = place(a, "sh", "c", 3)
    state["all_names"] = list(names)
    for name in names:
        publish(a, name, [b"%s-%d" % (name.encode(), i) for i in range(300)])
    # Transient messages of such a queue live only in c's memory.
    publish(a, names[0], [b"transient-%d" % i for i in range(20)],
            pika.BasicProperties(delivery_mode=1))
    # Ten gets on names[1] through b: five acked, five left unacked.
    conn = connect(b)
    ch = conn.channel()
    tags = []
    for _ in range(10):
        m, _, body = ch.basic_get(names[1], auto_ack=False)
        assert m is not None
        tags.append((m.delivery_tag, body))
    ch.basic_ack(tags[4][0], multiple=True)
    time.sleep(0.5)  # the acks and deliveries reach c's log (group commit)
    assert queue_dirs("c") >= set(names), queue_dirs("c")
    c.kill()
    killed = time.monotonic()
    try:
        conn.close()
    except Exception:
        pass

    def served():
        infos = [queue_info(a, n) for n in names]
        return all(i and i["primary"] in ("a", "b") and i.get("available", True)
                   for i in infos)
    wait_until(served, 20, what="c's queues taken over")
    took = time.monotonic() - killed
    owners = {n: queue_info(a, n)["primary"] for n in names}
    print("# takeover: %d queues serving on %s %.1f s after kill -9"
          % (len(names), sorted(set(owners.values())), took))
    # Their logs left c's directory for the takers' (each taker adopts as
    # it applies the map change; the staged copies go once copied).
    wait_until(lambda: not (queue_dirs("c") & set(names)), 10, what="c's logs moved",
               detail=lambda: queue_dirs("c"))
    for taker in set(owners.values()):
        adopted = os.path.join(shared, taker, "adopted")
        wait_until(lambda: not os.listdir(adopted), 10, what="staged copies removed")
    state["owners"] = owners
    # Every confirmed persistent message, through the broker that is not
    # the owner (by name, forwarded), once; transient ones are gone.
    for name in names:
        via = a if owners[name] == "b" else b
        got = drain(via, name)
        bodies = [body for body, _ in got]
        if name == names[1]:
            acked = {body for _, body in tags[:5]}
            unacked = {body for _, body in tags[5:]}
            want = [b"%s-%d" % (name.encode(), i) for i in range(300)]
            assert [x for x in bodies if x not in acked] == [x for x in want if x not in acked], \
                bodies[:12]
            # The five unacked deliveries come back redelivered (the acked
            # ones are gone, unless c died before their record was synced).
            redelivered = {body for body, r in got if r}
            assert unacked <= redelivered, (unacked, redelivered)
            assert len([x for x in bodies if x in acked]) in (0, 5), bodies[:12]
        else:
            assert bodies == [b"%s-%d" % (name.encode(), i) for i in range(300)], \
                (name, len(bodies), bodies[:3], bodies[-3:])
            assert not any(r for _, r in got)
    # The queues go on serving: publish through one broker, read through another.
    for name in names:
        publish(a, name, [b"after-%d" % i for i in range(50)])
        assert read_all(b, name) == [b"after-%d" % i for i in range(50)]


@test(timeout=120)
@noting_failure
def the_old_broker_restarted_leaves_the_taken_over_logs_alone():
    a, b, c = members["a"], members["b"], members["c"]
    names = state["all_names"]
    for name in names:
        publish(a, name, [b"kept-%d" % i for i in range(100)])
    c.start()
    wait_until(lambda: a.view() and a.view().brokers.get("c") == "up", 30, what="c up again")
    wait_until(lambda: "caught up with the map" in c.log_text(), 20, what="c caught up")
    # The queues stay where they were taken; c serves them by name, with
    # every message the takers confirmed.
    for name in names:
        assert queue_info(a, name)["primary"] == state["owners"][name]
        assert read_all(c, name) == [b"kept-%d" % i for i in range(100)], name
    # A restarted c opens fresh, empty logs for the queues its definitions
    # name, and drops them once the map says the queues live elsewhere:
    # never the taken-over ones (those are in the takers' directories).
    wait_until(lambda: not (queue_dirs("c") & set(names)), 10, what="c's stale logs gone",
               detail=lambda: queue_dirs("c"))
    assert "fenced" not in c.log_text() and "taken over by another" not in c.log_text()
    # Giving one back to c is an ordinary move (POST /api/cluster/move: c
    # catches up as a backup, then the taker hands over), not automatic.
    name = names[0]
    publish(a, name, [b"back-%d" % i for i in range(100)])
    status, body = a.api_call("POST", "/api/cluster/move", json.dumps(
        {"vhost": "/", "queue": name, "to": "c"}).encode(), timeout=5)
    assert status == 202, (status, body)
    wait_until(lambda: (queue_info(a, name) or {}).get("primary") == "c", 30,
               what="the queue moved back to c")
    assert read_all(b, name) == [b"back-%d" % i for i in range(100)]


@test(timeout=120)
@noting_failure
def the_rebalancer_gives_the_returned_broker_its_share():
    """c came back holding one queue (moved back by hand), its share went
    to the takers. With rebalancing turned on at run time the queues spread
    until c holds its share of primaries (the planner's bounds: within 10%
    of the average), each by a handover (taken-over logs included), with
    every message kept. (More queues first, and c emptied by moves, so that
    c is surely below its share however the ring fell.)"""
    a = members["a"]
    conn = connect(a)
    ch = conn.channel()
    for i in range(6):
        ch.queue_declare("sh-more-%d" % i, durable=True, arguments={"x-quay-backups": 0})
    conn.close()
    for q in a.api_get("/api/queues", timeout=5):
        if q["primary"] == "c":
            publish(a, q["name"], [b"to-a"])
            status, body = a.api_call("POST", "/api/cluster/move", json.dumps(
                {"vhost": "/", "queue": q["name"], "to": "a"}).encode(), timeout=5)
            assert status == 202, (status, body)
    held = {}

    def holdings():
        info = a.api_cluster()
        held.update((b["name"], b["primaries"]) for b in info["brokers"])
        return info["moves"]
    wait_until(lambda: not holdings() and held["c"] == 0, 30, what="c emptied",
               detail=lambda: held)
    before = {q["name"]: q["messages"] for q in a.api_get("/api/queues", timeout=5)}
    lo = math.floor(len(before) / 3 * 0.9)
    assert lo >= 1, before
    status, body = a.api_call("POST", "/api/cluster/rebalance", {"auto": True}, timeout=5)
    assert status == 202, (status, body)
    try:
        wait_until(lambda: not holdings() and held["c"] >= lo, 60, what="c's share back",
                   detail=lambda: held)
    finally:
        status, body = a.api_call("POST", "/api/cluster/rebalance", {"auto": False}, timeout=5)
        assert status == 202, (status, body)
    print("# %d queues; primaries after the rebalance: %s" % (len(before), held))
    after = {q["name"]: q["messages"] for q in a.api_get("/api/queues", timeout=5)}
    assert after == before, (before, after)
    for name, count in before.items():
        assert len(read_all(members["b"], name)) == count, name


@test(timeout=120)
@noting_failure
def a_cut_off_owner_resuming_cannot_write_to_the_log_it_lost():
    a, b, c = members["a"], members["b"], members["c"]
    # A queue on b, a publisher on b itself (its publishes go straight to b's log).
    name = place(a, "fence", "b", 1)[0]
    state["all_names"].append(name)
    confirmed = []
    failed = []
    stop = threading.Event()

    def publisher():
        conn = connect(b)
        ch = conn.channel()
        ch.confirm_delivery()
        i = 0
        try:
            while not stop.is_set():
                body = b"f-%d" % i
                ch.basic_publish("", name, body, PERSISTENT)
                confirmed.append(body)
                i += 1
        except Exception as e:  # nacked, or the connection closed: not confirmed
            failed.append(repr(e))
        try:
            conn.close()
        except Exception:
            pass
    t = threading.Thread(target=publisher, daemon=True)
    t.start()
    wait_until(lambda: len(confirmed) >= 200, 20, what="200 confirms")
    os.kill(b.proc.pid, signal.SIGSTOP)
    stopped_at = len(confirmed)
    try:
        wait_until(lambda: (queue_info(a, name) or {}).get("primary") in ("a", "c"), 20,
                   what="the stopped owner's queue taken over")
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    new_owner = queue_info(a, name)["primary"]
    # b, resumed, either synced a write to the lost log first (its batch in
    # flight at SIGSTOP, or a publish read before the map change): the
    # fence fails its journal for good; or it learned from the map first
    # and closed the log without a write. Either way nothing it wrote after
    # the takeover was confirmed (checked below).
    fenced = "taken over by another broker"
    left = "we leave that log to its new owner"
    wait_until(lambda: fenced in b.log_text() or left in b.log_text(), 20,
               what="b fenced or leaving the log")
    time.sleep(0.5)
    stop.set()
    t.join(30)
    assert not t.is_alive(), "the publisher is stuck: %d confirmed" % len(confirmed)
    print("# fence: %d confirmed before SIGSTOP, %d in all; b %s; publisher ended with %s"
          % (stopped_at, len(confirmed), "fenced" if fenced in b.log_text() else "left the log",
             failed[:1]))
    # Every message b confirmed, exactly once, on the new owner.
    other = a if new_owner == "c" else c
    got = read_all(other, name)
    counts = {}
    for body in got:
        counts[body] = counts.get(body, 0) + 1
    missing = [x for x in confirmed if counts.get(x, 0) == 0]
    dup = [x for x, n in counts.items() if n > 1]
    assert not missing, missing[:5]
    assert not dup, dup[:5]
    # b restarted is whole again and serves the queue by name.
    b.kill()
    b.start()
    wait_until(lambda: "caught up with the map" in b.log_text(), 30, what="b caught up")
    publish(b, name, [b"after-restart"])
    assert read_all(a, name) == [b"after-restart"]


@test(timeout=180)
@noting_failure
def two_brokers_dying_at_once_are_both_taken_over():
    """Five brokers (d and e join); two of them, each primary of durable
    queues without backups, die together: d freezes (SIGSTOP: still up in
    the map until its silence is noticed, 1.5 s), c is killed. The
    controller fails c over at once and gives some of its queues to d,
    which never adopts them; when d is down too, those go on to a live
    broker, which reads d's directory and c's (the map kept c as
    taken_from_before: d never said queue.adopted). The three left (a Raft
    majority) serve every one of those queues with every confirmed
    message. (Before queue.adopted, such a queue was served empty.)"""
    for name in ("d", "e"):
        members[name] = cluster.add(name, join=[members["a"]],
                                    extra_args=["--shared-storage", shared])
    a = members["a"]
    wait_until(lambda: all(v == "up" for v in a.view().brokers.values()) and
               len(a.view().brokers) == 5, 30, what="five brokers up")
    wait_until(lambda: all("caught up with the map" in members[n].log_text() for n in "de"),
               20, what="d and e caught up")
    names = place(a, "twice-c", "c", 10) + place(a, "twice-d", "d", 2)
    # And one whose primary is c and only backup d: no in-sync backup left
    # either, so it is taken over too, and gets a new backup, which must
    # hold what was adopted (its catch-up waits for the adoption).
    # Placed by moves (the ring may keep new queues off c, at its share).
    both = "twice-cd"
    conn = connect(a)
    conn.channel().queue_declare(both, durable=True, arguments={"x-quay-backups": 1})
    conn.close()

    def move(body):
        status, answer = a.api_call("POST", "/api/cluster/move", json.dumps(
            dict(body, vhost="/", queue=both)).encode(), timeout=5)
        assert status == 202, (status, answer)
    info = queue_info(a, both)
    if info["primary"] != "c":
        move({"to": "c"})
        wait_until(lambda: queue_info(a, both)["primary"] == "c" and
                   not a.api_cluster()["moves"], 20, what="twice-cd on c")
    backup = queue_info(a, both)["backups"][0]
    if backup != "d":
        move({"to": "d", "backup_of": backup})
    wait_until(lambda: queue_info(a, both)["in_sync"] == ["d"], 20, what="d in sync")
    names.append(both)
    for name in names:
        publish(a, name, [b"%s-%d" % (name.encode(), i) for i in range(200)])
    time.sleep(0.3)  # group commit: every confirm's record is in the logs
    os.kill(members["d"].proc.pid, signal.SIGSTOP)
    members["c"].kill()

    def taken():
        infos = [queue_info(a, n) for n in names]
        return all(i and i["primary"] in ("a", "b", "e") and i.get("available", True)
                   for i in infos) and infos
    infos = wait_until(taken, 30, what="both brokers' queues taken over")
    members["d"].kill()  # (frozen: it never ran again)
    # A queue of c's that went through d: nothing in d's log, then c's.
    logs = "".join(m.log_text() for m in (a, members["b"], members["e"]))
    via_d = sum("queue '%s': took over 0 messages from d's log" % n in logs
                for n in names if n.startswith("twice-c-"))
    print("# taken over by %s; %d queue(s) of c's through d, which never adopted them"
          % (sorted(i["primary"] for i in infos), via_d))
    for name in ("a", "b", "e"):  # what each taker had to adopt is done
        wait_until(lambda: metric(members[name], "quay_cluster_adoptions_pending") == 0, 20,
                   what="%s's adoptions done" % name)

    def new_backup():
        info = queue_info(a, both)
        return info["backups"] and info["in_sync"] == info["backups"] and info
    info = wait_until(new_backup, 30, what="a new backup in sync")
    copy = queue_info(members[info["backups"][0]], both)
    assert copy["role"] == "backup" and copy["replica_messages"] == 200, copy
    for name in names:
        assert read_all(members["e"], name) == [b"%s-%d" % (name.encode(), i)
                                                for i in range(200)], name


PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 17, 0x4206, 0x4207, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def ptrace(request, tid):
    if libc.ptrace(request, tid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "ptrace %#x of %d" % (request, tid))


def freeze_journal(member):
    """Stops member's journal thread alone (ptrace; we are its tracer):
    nothing the broker hands its journal from then on is written or
    synced, while its loop, Raft and API go on. Returns the thread id."""
    pid = member.proc.pid
    tids = []
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
            if f.read().strip() == "quay-journal":
                tids.append(int(tid))
    assert tids, "no journal thread in %s" % member.name
    tid = min(tids)  # the broker's own journal, opened first
    ptrace(PTRACE_SEIZE, tid)
    ptrace(PTRACE_INTERRUPT, tid)
    os.waitpid(tid, WALL)  # stopped
    return tid


def kill_frozen(member, tid):
    """kill -9 of a broker whose journal thread we trace (we reap it)."""
    os.kill(member.proc.pid, signal.SIGKILL)
    os.waitpid(tid, WALL)
    member.proc.wait(10)


@test(timeout=240)
@noting_failure
def a_taker_killed_before_its_copy_was_synced_loses_nothing():
    """c dies with 16 queues of confirmed persistent messages and no
    backups, while the journal threads of all the others are frozen
    (ptrace): what they copy from c's logs reaches none of their own logs.
    One of the takers is killed once it adopted its share: a crash before
    its sync. Its queue.adopted waits for that sync, so it never said it:
    the next takers read its log and then c's, which it had staged in its
    adopted/ directory. Their journals thawed, every confirmed message is
    served. (Before, a taker said queue.adopted once its copy was queued,
    the next taker read the dead taker's log alone, and those queues were
    served empty.)"""
    a = members["a"]
    for name in "cd":
        if not members[name].alive():
            members[name].start()
    wait_until(lambda: len(a.view().brokers) == 5 and
               all(v == "up" for v in a.view().brokers.values()), 30, what="five brokers up")
    for name in "cd":
        m = members[name]
        wait_until(lambda: "caught up with the map" in m.log_text_bytes()[m.log_offset:].decode(
            "utf-8", "replace"), 30, what="%s caught up" % name)
    names = place(a, "unsynced", "c", 16)
    for name in names:
        publish(a, name, [b"%s-%d" % (name.encode(), i) for i in range(100)])
    time.sleep(0.3)  # group commit: every confirm's record is in c's logs
    frozen = {}
    try:
        for name in "abde":
            frozen[name] = freeze_journal(members[name])
        members["c"].kill()

        def taken():
            infos = [queue_info(a, n) for n in names]
            return all(i and i["primary"] in "abde" and i.get("available", True)
                       for i in infos) and infos
        infos = wait_until(taken, 30, what="c's queues taken over")
        share = {t: [i["name"] for i in infos if i["primary"] == t] for t in "bde"}
        taker = max(share, key=lambda t: len(share[t]))
        via = share[taker]
        assert via, "c's queues all went to a: %s" % [i["primary"] for i in infos]
        log = members[taker].log_text
        wait_until(lambda: all("queue '%s': took over 100 messages from c's log" % n in log()
                               for n in via), 30, what="%s adopted" % taker)
        time.sleep(1)  # ten member ticks: a queue.adopted said too early commits
        kill_frozen(members[taker], frozen.pop(taker))
        print("# %d of c's queues went through %s, killed before its copy was synced"
              % (len(via), taker))
        alive = [t for t in "abde" if t != taker]

        def retaken():
            infos = [queue_info(a, n) for n in via]
            return all(i and i["primary"] in alive and i.get("available", True) for i in infos)
        wait_until(retaken, 30, what="%s's queues taken over again" % taker)
        for name in alive:
            wait_until(lambda: metric(members[name], "quay_cluster_adoptions_pending") == 0, 20,
                       what="%s's adoptions done" % name)
    finally:
        for name, tid in frozen.items():
            ptrace(PTRACE_DETACH, tid)
    for name in names:
        got = read_all(a, name)
        assert got == [b"%s-%d" % (name.encode(), i) for i in range(100)], (name, len(got))
    logs = "".join(members[n].log_text() for n in alive)
    for name in via:
        assert ("queue '%s': took over 100 messages from c's log, staged by a taker that "
                "died" % name) in logs, name


@test(timeout=240)
@noting_failure
def a_taker_restarted_before_its_copy_was_synced_loses_nothing():
    """A cluster of its own: o and t share a directory, x, y and z (the
    Raft majority) do not. o dies with 4 queues of confirmed persistent
    messages and no backups; t, its journal thread frozen, takes them over
    (its copy, and the queues' definitions, never reach its own log) and
    is killed: nobody else shares the storage, so the queues stay t's,
    unavailable. t restarted is their primary again. Two it never had a
    log of: the queue.take_over makes them real and t adopts them anew,
    from the copies it had staged in its adopted/ directory (o's directory
    has none left). Two were t's before they moved to o: its restart
    recovers them from its own (empty) logs and resumes their adoption, or,
    where its log became its replica's at the switch (kept until o applied
    it: map_queue_switch_keeps_primary), drops that and adopts them anew.
    Every confirmed message is served. (Before, t read o's directory only
    for the first two, did not adopt the other two at all, and served all
    four empty; the staged copies stayed, unread.)"""
    x = sharing_cluster(["o", "t"])
    o, t = members["o"], members["t"]
    names = place(x, "restarted", "o", 2)
    # Two more were t's first (its journal has their definitions and logs:
    # its restart recovers them, and resumes their adoption).
    for name in place(x, "resumed", "t", 2):
        status, body = x.api_call("POST", "/api/cluster/move", json.dumps(
            {"vhost": "/", "queue": name, "to": "o"}).encode(), timeout=5)
        assert status == 202, (status, body)
        wait_until(lambda: queue_info(x, name)["primary"] == "o" and
                   not x.api_cluster()["moves"], 20, what="%s moved to o" % name)
        names.append(name)
    for name in names:
        publish(x, name, [b"%s-%d" % (name.encode(), i) for i in range(100)])
    time.sleep(0.3)  # group commit: every confirm's record is in o's logs
    tid = freeze_journal(t)
    try:
        o.kill()
        wait_until(lambda: all((queue_info(x, n) or {}).get("primary") == "t" for n in names),
                   30, what="o's queues taken over by t")
        wait_until(lambda: all("queue '%s': took over 100 messages from o's log" % n
                               in t.log_text() for n in names), 30, what="t adopted")
        time.sleep(1)  # (a queue.adopted said too early commits)
    finally:
        kill_frozen(t, tid)
    assert os.listdir(os.path.join(shared, "t", "adopted")), "nothing staged"
    # While t comes back, x's clients publish to the queues: forwarded to
    # t once the map has it up, they wait in the held queues until t has
    # caught up, and must not take the seqs of what it resumes adopting.
    publisher = RoundRobinPublisher(x, names, b"later-", pause=0.01)
    try:
        t.start()
        wait_until(lambda: "caught up with the map" in t.log_text_bytes()[t.log_offset:]
                   .decode("utf-8", "replace"), 30, what="t caught up")
        wait_until(lambda: all((queue_info(x, n) or {}).get("primary") == "t" and
                               queue_info(x, n).get("available", True) for n in names), 30,
                   what="t serving o's queues again")
        wait_until(lambda: metric(t, "quay_cluster_adoptions_pending") == 0, 20,
                   what="t's adoptions done")
        time.sleep(0.5)
    finally:
        publisher.stop()
    assert not publisher.errors, publisher.errors
    later = publisher.confirmed
    bad = {}
    for name in names:
        got = read_all(x, name)
        want = [b"%s-%d" % (name.encode(), i) for i in range(100)] + later[name]
        if got != want:
            # What a failure needs to be traced: which went missing, which
            # came twice or unasked, and where the order first differs.
            first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w),
                         min(len(got), len(want)))
            bad[name] = {"served": len(got), "later": len(later[name]),
                         "missing": sorted(set(want) - set(got)),
                         "extra": sorted(set(got) - set(want)),
                         "twice": sorted(b for b in set(got) if got.count(b) > 1),
                         "first_difference_at": first}
    assert not bad, "messages served, of 100 and those published later: %s" % bad
    print("# %d published while t came back" % sum(len(v) for v in later.values()))
    text = t.log_text_bytes()[t.log_offset:].decode("utf-8", "replace")
    print("# t restarted: %d of the %d queues resumed (recovered from its own log), the "
          "others adopted anew" % (text.count("resuming it"), len(names)))
    for name in names:
        assert ("queue '%s': took over 100 messages from o's log, staged by us before a "
                "restart" % name) in text, name
    # Once synced, t said queue.adopted and removed what it had staged.
    wait_until(lambda: not os.listdir(os.path.join(shared, "t", "adopted")), 10,
               what="t's staged copies removed")



@test(timeout=240)
@noting_failure
def an_old_owner_restarted_before_its_logs_were_renamed_keeps_them():
    """o is cut off (SIGSTOP), then t frozen too, 1 s later: when the map
    marks o down it gives o's queues to t, up still, which renames
    nothing. o resumed learns that its queues were taken and leaves their
    logs to t (closed without a write); killed and restarted before t
    renamed them, it must not delete them as the logs of queues it no
    longer defines. Then t resumes (or, marked down meanwhile, whoever
    the map gives them to) and every confirmed message is served.
    (Before, o's leaving the logs undefined the queues in its journal, and
    its next start deleted the logs: "not declared".)"""
    x = sharing_cluster(["o", "t"])
    o, t = members["o"], members["t"]
    names = place(x, "leftlog", "o", 2)
    for name in names:
        publish(x, name, [b"%s-%d" % (name.encode(), i) for i in range(100)])
    time.sleep(0.3)  # group commit: every confirm's record is in o's logs
    os.kill(o.proc.pid, signal.SIGSTOP)
    time.sleep(1.0)
    os.kill(t.proc.pid, signal.SIGSTOP)
    try:
        frozen_at = time.time()
        wait_until(lambda: all((queue_info(x, n) or {}).get("primary") == "t" for n in names),
                   10, what="o's queues given to t", interval=0.02)
        os.kill(o.proc.pid, signal.SIGCONT)
        wait_until(lambda: all("queue '%s' was taken over from our log" % n in o.log_text()
                               for n in names), 10, what="o leaving its logs to t",
                   interval=0.02)
        time.sleep(0.05)  # (what o's journal wrote then is synced)
        o.kill()
        print("# o resumed and killed %.2f s after t froze" % (time.time() - frozen_at))
        o.start()
        wait_until(lambda: "caught up with the map" in o.log_text_bytes()[o.log_offset:]
                   .decode("utf-8", "replace"), 30, what="o caught up")
    finally:
        for m in (o, t):
            if m.alive():
                os.kill(m.proc.pid, signal.SIGCONT)
    text = o.log_text()
    deleted = [n for n in names if "deleting queue vhost=/ queue=%s: not declared" % n in text]
    assert not deleted, "o deleted the logs of %s at its start" % deleted
    wait_until(lambda: all((queue_info(x, n) or {}).get("available", True) and
                           (queue_info(x, n) or {}).get("primary") in ("o", "t") for n in names),
               30, what="the queues served again")
    for m in (o, t):
        wait_until(lambda: metric(m, "quay_cluster_adoptions_pending") == 0, 20,
                   what="%s's adoptions done" % m.name)
    bad = {}
    for name in names:
        got = read_all(x, name)
        if got != [b"%s-%d" % (name.encode(), i) for i in range(100)]:
            bad[name] = len(got)
    assert not bad, "messages served, of 100: %s" % bad


def log_dir_of(broker, name):
    """The directory of name's log in broker's queues/ on the shared
    storage (its header file holds the queue's name), or None."""
    root = os.path.join(shared, broker, "queues")
    for d in os.listdir(root) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, d, "queue"), "rb") as f:
                if f.read().rstrip(b"\0").endswith(b"/" + name.encode()):  # (vhost "/")
                    return os.path.join(root, d)
        except OSError:
            continue
    return None


@test(timeout=240)
@noting_failure
def staged_copies_a_restart_kept_go_once_unneeded_while_running():
    """A cluster of its own: t and u share a directory, x, y and z (the
    Raft majority) do not. t owns two queues; u's journal thread is frozen
    (ptrace) and t is killed: u takes both over (the map: taken from t,
    not adopted) and cannot say queue.adopted (its copy never syncs).
    While t is down, the test leaves in t's adopted/ directory what a
    takeover of t's that died between its sync and the removal of its
    staged copy leaves there: adopted/<source>.<id>/queues/<id>/queue,
    naming each queue (the header file of t's own log of it, copied while
    t ran; a sweep reads nothing else). t restarted keeps both (u's
    takeover is not adopted yet, and u may read what t staged). Then u
    thaws and says queue.adopted for the first, and the second is
    deleted: t removes each copy while it runs. (Before, they stayed
    until t's next start.)"""
    x = sharing_cluster(["t", "u"])
    t, u = members["t"], members["u"]
    adopted, deleted = place(x, "kept", "t", 2)
    headers = {}
    for name in (adopted, deleted):
        publish(x, name, [b"%s-%d" % (name.encode(), i) for i in range(10)])
        d = log_dir_of("t", name)
        assert d, "no log of %s in t's directory" % name
        with open(os.path.join(d, "queue"), "rb") as f:
            headers[name] = (os.path.basename(d), f.read())
    tid = freeze_journal(u)
    planted = {}
    try:
        t.kill()
        wait_until(lambda: all((queue_info(x, n) or {}).get("primary") == "u"
                               for n in headers), 30, what="t's queues taken over by u")
        wait_until(lambda: all("queue '%s': took over 10 messages from t's log" % n
                               in u.log_text() for n in headers), 30, what="u adopted")
        for name, (log_id, header) in headers.items():
            root = os.path.join(shared, "t", "adopted", "o.%s" % log_id)
            os.makedirs(os.path.join(root, "queues", log_id))
            with open(os.path.join(root, "queues", log_id, "queue"), "wb") as f:
                f.write(header)
            planted[name] = root
        t.start()
        wait_until(lambda: "caught up with the map" in t.log_text_bytes()[t.log_offset:]
                   .decode("utf-8", "replace"), 30, what="t caught up")
        time.sleep(1)  # map changes come and go (t is up again): nothing is unneeded yet
        assert all(os.path.isdir(p) for p in planted.values()), \
            "t removed a staged copy u's takeover (not adopted) may still read"
        conn = connect(x)
        conn.channel().queue_delete(deleted)
        conn.close()
        wait_until(lambda: not os.path.isdir(planted[deleted]), 10,
                   what="t's copy of %s removed once it was deleted" % deleted)
        time.sleep(0.5)
        assert os.path.isdir(planted[adopted]), "t removed the other copy too"
    finally:
        ptrace(PTRACE_DETACH, tid)
    wait_until(lambda: not os.path.isdir(planted[adopted]), 10,
               what="t's copy of %s removed once u said queue.adopted" % adopted)
    assert read_all(x, adopted) == [b"%s-%d" % (adopted.encode(), i) for i in range(10)]
    text = t.log_text_bytes()[t.log_offset:].decode("utf-8", "replace")
    assert text.count("a copy we had staged for its takeover is no longer needed") == 2, text


class RoundRobinPublisher:
    """A thread that publishes persistent messages to names in turn
    (b"NAME-TAG-I") through via with confirms, pausing pause s a round,
    until stop(). confirmed: {name: [bodies confirmed, in order]}; a nacked
    or unroutable one (the queue unavailable for a moment) is not. Any
    other error ends the thread and is kept in errors."""

    def __init__(self, via, names, tag, pause=0.0):
        self.confirmed = {n: [] for n in names}
        self.errors = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(via, names, tag, pause))
        self._thread.start()

    def _run(self, via, names, tag, pause):
        c = connect(via)
        ch = c.channel()
        ch.confirm_delivery()
        i = 0
        try:
            while not self._stop.is_set():
                for n in names:
                    body = b"%s-%s%d" % (n.encode(), tag, i)
                    try:
                        ch.basic_publish("", n, body, PERSISTENT)
                        self.confirmed[n].append(body)
                    except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                        pass
                i += 1
                time.sleep(pause)
        except Exception as e:
            self.errors.append(repr(e))
        try:
            c.close()
        except Exception:
            pass

    def stop(self):
        self._stop.set()
        self._thread.join(30)


def fresh_cluster():
    """Closes the cluster so far (keeping its logs if a test failed) and
    starts a new one, not formed yet, with a new shared directory."""
    global cluster, shared
    old = cluster
    cluster = None
    if old is not None:
        old.failed = old.failed or state.get("failed", False)  # (keeps its logs)
    problems = old.close() if old is not None else []
    assert not problems, problems
    cluster = Cluster()
    shared = os.path.join(cluster.dir, "shared")


def own_cluster(names, extra=()):
    """Closes the cluster so far (keeping its logs if a test failed) and
    forms a new one of names on one shared directory (extra: more options
    for each)."""
    fresh_cluster()
    for m in cluster.form(names, extra_args=list(extra) + ["--shared-storage", shared,
                                             "--log-level", os.environ.get("LOGLEVEL", "info")]):
        members[m.name] = m
    first = members[names[0]]
    wait_until(lambda: sum(1 for b in first.api_cluster()["brokers"] if b.get("storage")) ==
               len(names), 10, what="every broker's storage in the map")
    return [members[n] for n in names]


def place_replicated(via, name, primary, backup, arguments):
    """Declares name (durable, one backup) through via and moves it until
    its primary and its one in-sync backup are the brokers named."""
    conn = connect(via)
    conn.channel().queue_declare(name, durable=True,
                                 arguments=dict(arguments, **{"x-quay-backups": 1}))
    conn.close()

    def move(body):
        status, answer = via.api_call("POST", "/api/cluster/move", json.dumps(
            dict(body, vhost="/", queue=name)).encode(), timeout=5)
        assert status == 202, (status, answer)
    if queue_info(via, name)["primary"] != primary:
        move({"to": primary})
        wait_until(lambda: queue_info(via, name)["primary"] == primary and
                   not via.api_cluster()["moves"], 20, what="%s on %s" % (name, primary))
    have = queue_info(via, name)["backups"][0]
    if have != backup:
        move({"to": backup, "backup_of": have})
    wait_until(lambda: queue_info(via, name)["in_sync"] == [backup] and
               queue_info(via, name)["backups"] == [backup] and not via.api_cluster()["moves"],
               20, what="%s's backup %s in sync" % (name, backup))


TRANSIENT = pika.BasicProperties(delivery_mode=1)


@test(timeout=240)
@noting_failure
def transient_only_replication_loses_no_confirmed_message_on_kill():
    """x-quay-replicate "transient": the backup holds the transient
    messages only (replica_messages), the persistent ones are in the
    primary's log on the shared storage. kill -9 of the primary under
    confirmed load (persistent and transient, alternating, through another
    broker), with deliveries acked and unacked: the backup takes the queue
    over keeping its replica and merges it with the dead primary's log.
    Every confirmed message is served, in publish order, no acked one comes
    back unless flagged redelivered, and no message is served twice
    unflagged. (Without the merge, the backup promoted as usual served the
    transient ones only; without the log read, the persistent ones were
    lost.)"""
    p, q, r = own_cluster(["p", "q", "r"])
    name = "tonly"
    place_replicated(p, name, "r", "q", {"x-quay-replicate": "transient"})
    # (r may apply the end of the placement's backup move after p: until
    # then it replicates everything.)
    wait_until(lambda: queue_info(r, name).get("replicating") == "transient", 10,
               what="r replicating the transient messages only")
    # The mode: the backup's copy holds the 50 transient messages only.
    conn = connect(p)
    ch = conn.channel()
    ch.confirm_delivery()
    sent = []
    for i in range(150):
        body = b"pre-%d" % i
        ch.basic_publish("", name, body, TRANSIENT if i % 3 == 2 else PERSISTENT)
        sent.append(body)
    conn.close()
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 50, 10,
               what="the backup holding the transient messages only",
               detail=lambda: queue_info(q, name))
    # Twenty deliveries through p: the first ten acked, the others not.
    consumer = connect(p)
    cch = consumer.channel()
    got_before = []
    for _ in range(20):
        m, _, body = cch.basic_get(name, auto_ack=False)
        assert m is not None
        got_before.append((m.delivery_tag, body))
    cch.basic_ack(got_before[9][0], multiple=True)
    acked = {body for _, body in got_before[:10]}
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 50 - sum(
        1 for b in acked if int(b.split(b"-")[1]) % 3 == 2), 10, what="acks on the backup")
    time.sleep(0.3)  # group commit: the acks are in r's log
    # Confirmed load through p while r dies.
    confirmed = []
    stop = threading.Event()

    def publisher():
        c = connect(p)
        pch = c.channel()
        pch.confirm_delivery()
        i = 0
        while not stop.is_set():
            body = b"load-%d" % i
            try:
                pch.basic_publish("", name, body, TRANSIENT if i % 2 else PERSISTENT)
                confirmed.append(body)
            except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                pass
            except Exception:
                break
            i += 1
        try:
            c.close()
        except Exception:
            pass
    t = threading.Thread(target=publisher)
    t.start()
    try:
        wait_until(lambda: len(confirmed) >= 300, 20, what="load confirmed")
        r.kill()
        wait_until(lambda: (queue_info(p, name) or {}).get("primary") == "q", 20,
                   what="q serving the queue")
        wait_until(lambda: len(confirmed) >= 300 + 200, 20, what="confirms after the kill")
    finally:
        stop.set()
        t.join(30)
    try:
        consumer.close()
    except Exception:
        pass
    wait_until(lambda: metric(q, "quay_cluster_adoptions_pending") == 0, 20,
               what="q's adoption done")
    out = drain(p, name)
    bodies = [b for b, _ in out]
    missing = [b for b in sent + confirmed if b not in acked and b not in bodies]
    assert not missing, "%d confirmed messages lost, e.g. %s" % (len(missing), missing[:5])
    # Twice unflagged: only the one publish in flight when r died (p resends
    # what r never answered; r may have logged it: at-least-once).
    unflagged = [b for b, red in out if not red]
    twice = {b for b in unflagged if unflagged.count(b) > 1}
    assert len(twice) <= 1 and all(b.startswith(b"load-") for b in twice), \
        "served twice unflagged: %s" % sorted(twice)[:5]
    back = [b for b, red in out if b in acked and not red]
    assert not back, "acked and served again unflagged: %s" % back
    # Publish order, each message at its first place.
    order = {b: i for i, b in enumerate(sent + confirmed)}
    first = []
    for b in bodies:
        if b in order and b not in first:
            first.append(b)
    assert first == sorted(first, key=order.get), "out of order: %s" % first[:20]
    unacked = {body for _, body in got_before[10:]}
    assert unacked <= {b for b, red in out if red}, "unacked ones not redelivered"
    assert "from r's log" in q.log_text(), "q did not read r's log"
    print("# %d confirmed before and during the kill, all served (%d redelivered)"
          % (len(sent) + len(confirmed), sum(1 for _, red in out if red)))


@test(timeout=240)
@noting_failure
def kill_9_under_confirmed_load_loses_no_confirmed_message():
    """Two durable queues without backups on r; a publisher through p
    (forwarded to r) confirms persistent messages to both while r is
    killed (kill -9): the takers adopt r's logs and serve on. Every
    message p confirmed, before and after the kill, is served once in
    publish order; at most the one publish per queue in flight at the kill
    is served twice (the proxy resends what the dead primary never
    answered; r may have logged it), flagged redelivered or not."""
    p, q, r = own_cluster(["p", "q", "r"])
    names = place(p, "load", "r", 2)
    publisher = RoundRobinPublisher(p, names, b"")
    confirmed = publisher.confirmed
    try:
        wait_until(lambda: min(len(v) for v in confirmed.values()) >= 300, 20,
                   what="300 confirmed per queue")
        r.kill()
        before = {n: len(v) for n, v in confirmed.items()}
        wait_until(lambda: all((queue_info(p, n) or {}).get("primary") in ("p", "q")
                               for n in names), 20, what="r's queues taken over")
        wait_until(lambda: all(len(confirmed[n]) >= before[n] + 300 for n in names), 30,
                   what="300 more confirmed per queue after the kill")
    finally:
        publisher.stop()
    assert not publisher.errors, publisher.errors
    for m in (p, q):
        wait_until(lambda: metric(m, "quay_cluster_adoptions_pending") == 0, 20,
                   what="%s's adoptions done" % m.name)
    for n in names:
        bodies = [b for b, _ in drain(q, n)]
        missing = [b for b in confirmed[n] if b not in bodies]
        assert not missing, "%s: %d confirmed messages lost, e.g. %s" % (n, len(missing),
                                                                         missing[:3])
        twice = {b for b in bodies if bodies.count(b) > 1}
        assert len(twice) <= 1, "%s: served twice: %s" % (n, sorted(twice)[:5])
        order = {b: i for i, b in enumerate(confirmed[n])}
        first = []
        for b in bodies:
            if b in order and b not in first:
                first.append(b)
        assert first == sorted(first, key=order.get), "%s: out of order" % n
    print("# %d confirmed, %d of them after the kill, all served"
          % (sum(len(v) for v in confirmed.values()),
             sum(len(confirmed[n]) - before[n] for n in names)))


def put_policy(member, name, pattern, replicate):
    status, body = member.api_call("PUT", "/api/policies/%2F/" + name, json.dumps(
        {"pattern": pattern, "priority": 0, "backups": 1, "quay-replicate": replicate})
        .encode(), timeout=10)
    assert status in (201, 204), (status, body)


@test(timeout=240)
@noting_failure
def a_policy_turns_transient_only_replication_on_and_off_at_run_time():
    """The policy key quay-replicate does what the argument does, for a
    queue without the argument, and follows the policy at run time: on
    "transient" a live backup stream goes on with the transient messages
    only at once (no catch-up: it held everything so far); on "all" the
    map drops the backup from the in-sync set in the same command and the
    primary catches it up in full before it is in sync again (it held the
    transient ones only). kill -9 of the primary then: the backup takes
    the queue over keeping its replica (the controller reads the policy)
    and every confirmed message is served, in order. (Without the key the
    queue replicated everything; without the re-attach on a policy change
    the stream kept its mode until the next change of the queue.)"""
    p, q, r = own_cluster(["p", "q", "r"])
    name = "pol.q"
    put_policy(p, "tonly", "^pol\\.", "transient")
    place_replicated(p, name, "r", "q", {})
    wait_until(lambda: queue_info(r, name).get("replicating") == "transient", 10,
               what="r replicating the transient messages only (the policy)")
    sent = []

    def send(count, start):
        conn = connect(p)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(start, start + count):
            body = b"m-%d" % i
            ch.basic_publish("", name, body, TRANSIENT if i % 3 == 2 else PERSISTENT)
            sent.append(body)
        conn.close()
    send(45, 0)
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 15, 10,
               what="the backup holding the 15 transient ones only",
               detail=lambda: queue_info(q, name))
    put_policy(p, "tonly", "^pol\\.", "all")
    wait_until(lambda: queue_info(r, name).get("replicating") == "all", 10,
               what="r replicating everything (the policy changed)")
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 45 and
               queue_info(p, name)["in_sync"] == ["q"], 20,
               what="the backup caught up in full and in sync again",
               detail=lambda: (queue_info(q, name), queue_info(p, name)))
    assert "caught up again in full" in r.log_text(), "no full catch-up on r"
    send(15, 45)
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 60, 10,
               what="the backup holding all 60")
    put_policy(p, "tonly", "^pol\\.", "transient")
    wait_until(lambda: queue_info(r, name).get("replicating") == "transient", 10,
               what="r back to the transient messages only")
    send(9, 60)  # 6 persistent (not sent to the backup), 3 transient
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 63, 10,
               what="the backup given the 3 new transient ones only",
               detail=lambda: queue_info(q, name))
    assert queue_info(p, name)["in_sync"] == ["q"]
    r.kill()
    wait_until(lambda: (queue_info(p, name) or {}).get("primary") == "q" and
               metric(q, "quay_cluster_adoptions_pending") == 0, 20,
               what="q serving the queue, adopted")
    assert "from r's log" in q.log_text(), "q did not take r's log over with its replica"
    got = [b for b, _ in drain(p, name)]
    assert got == sent, "served %d of %d, first differences: %s" % (
        len(got), len(sent), [(a, b) for a, b in zip(got, sent) if a != b][:3])


@test(timeout=240)
@noting_failure
def a_transient_only_queue_moved_then_killed_keeps_every_message():
    """A planned move of an x-quay-replicate "transient" queue to its
    backup, which held the transient messages only: the primary first
    catches every backup up in full (the handover hands the target the
    queue as its replica holds it), then hands over; the mode comes back
    once the move is over. kill -9 of the new primary then: its backup
    takes it over from its log and merges. Every confirmed message is
    served, in order. (With a handover to the transient-only backup, the
    move itself lost the persistent messages.)"""
    p, q, r = own_cluster(["p", "q", "r"])
    name = "tmove"
    place_replicated(p, name, "r", "q", {"x-quay-replicate": "transient"})
    wait_until(lambda: queue_info(r, name).get("replicating") == "transient", 10,
               what="r replicating the transient messages only")
    first = [b"first-%d" % i for i in range(90)]
    conn = connect(p)
    ch = conn.channel()
    ch.confirm_delivery()
    for i, body in enumerate(first):
        ch.basic_publish("", name, body, TRANSIENT if i % 3 == 2 else PERSISTENT)
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 30, 10,
               what="q holding the transient messages only")
    status, answer = p.api_call("POST", "/api/cluster/move", json.dumps(
        {"vhost": "/", "queue": name, "to": "q"}).encode(), timeout=5)
    assert status == 202, (status, answer)
    wait_until(lambda: queue_info(p, name)["primary"] == "q" and not p.api_cluster()["moves"],
               20, what="moved to q")
    info = wait_until(lambda: (lambda i: i["in_sync"] and i["in_sync"] == i["backups"] and i)(
        queue_info(p, name)), 20, what="a backup in sync after the move")
    backup = members[info["in_sync"][0]]
    second = [b"second-%d" % i for i in range(90)]
    for i, body in enumerate(second):
        ch.basic_publish("", name, body, TRANSIENT if i % 3 == 2 else PERSISTENT)
    conn.close()
    # The mode is back: the second batch's persistent messages did not
    # reach the backup (it holds at most everything of the first batch and
    # the second's 30 transient ones).
    wait_until(lambda: queue_info(backup, name).get("replica_messages", 0) >= 30, 10,
               what="the backup's copy")
    held = queue_info(backup, name)["replica_messages"]
    assert held <= 90 + 30, held
    time.sleep(0.3)  # group commit
    q.kill()
    wait_until(lambda: (queue_info(p, name) or {}).get("primary") == backup.name, 20,
               what="%s serving the queue" % backup.name)
    wait_until(lambda: metric(backup, "quay_cluster_adoptions_pending") == 0, 20,
               what="the adoption done")
    via = p if backup.name != "p" else r
    got = drain(via, name)
    bodies = [b for b, _ in got]
    assert bodies == first + second, (len(bodies), [b for b in first + second
                                                    if b not in bodies][:5])
    print("# moved, then killed: all %d served; the backup held %d of 180 before the kill"
          % (len(bodies), held))


@test(timeout=240)
@noting_failure
def a_transient_only_queue_whose_primary_restarted_at_once_loses_nothing():
    """x-quay-replicate "transient": the primary (the Raft leader) is
    killed and restarted while the map cannot mark it down
    (restart_without_quorum). Its log gives it back the persistent
    messages, its in-sync backup holds the transient ones: neither alone
    is the queue. The restarted primary hands it to that backup as a
    takeover with the replica (the backup reads its log and merges), never
    serving its half. Every confirmed message is then read, in order.
    (Before, it served what its log held and caught the backup up to
    that: the transient half was lost.)"""
    p, q, r = own_cluster(["p", "q", "r"])
    name = "trestart"
    place_replicated(p, name, "p", "q", {"x-quay-replicate": "transient"})
    wait_until(lambda: queue_info(p, name).get("replicating") == "transient", 10,
               what="p replicating the transient messages only")
    conn = connect(p)
    ch = conn.channel()
    ch.confirm_delivery()
    want = publish_half_transient(ch, name, 100)
    conn.close()
    wait_until(lambda: queue_info(q, name).get("replica_messages") == 50, 10,
               what="q holding the transient messages only",
               detail=lambda: queue_info(q, name))
    time.sleep(0.3)  # group commit: the persistent half is in p's log
    restart_without_quorum(p, r)
    wait_until(lambda: (queue_info(r, name) or {}).get("primary") == "q", 30,
               what="the queue handed to q", detail=lambda: queue_info(r, name))
    wait_until(lambda: metric(q, "quay_cluster_adoptions_pending") == 0, 20,
               what="q's adoption done")
    # Usually the restarted primary hands it over; the map may see it down
    # first (its new links reset as it comes back): then the failover's
    # takeover with the replica reads the log. Either way nothing is lost.
    handed = "its in-sync backup q holds what our journal could not (transient messages): " \
        "handing it over there, with our log to read" in p.log_text()
    print("# %s" % ("handed over by the restarted primary" if handed else
                    "failed over: the map saw the primary down first"))
    assert "from p's log" in q.log_text(), "q did not read p's log"
    # p left its log to q without a write: its journal goes on.
    assert "was taken over from our log on the shared storage" in p.log_text()
    assert "taken over by another broker" not in p.log_text(), "p's journal was fenced"
    got = read_all(r, name)
    assert got == want, "served %d of %d: %s" % (len(got), len(want), got[:6])


def sharing_cluster(sharing):
    """A cluster of its own: x, y and z (a Raft majority) do not share the
    directory; the brokers named in sharing do, each up, caught up with
    the map and with its storage in it. Returns x."""
    fresh_cluster()
    x = cluster.form(["x", "y", "z"])[0]
    for name in sharing:
        members[name] = cluster.add(name, join=[x], extra_args=["--shared-storage", shared])
    total = 3 + len(sharing)
    wait_until(lambda: len(x.view().brokers) == total and
               all(v == "up" for v in x.view().brokers.values()),
               30 if total <= 5 else 60, what="%d brokers up" % total)
    wait_until(lambda: all("caught up with the map" in members[n].log_text() for n in sharing),
               30, what="%s caught up" % ", ".join(sharing))
    wait_until(lambda: sum(1 for b in x.api_cluster()["brokers"] if b.get("storage")) ==
               len(sharing), 10, what="the shared storage in the map")
    return x


def seven_with_takers():
    """The chain tests' cluster: o, t, u and v share the directory (x, y and
    z, a Raft majority of seven, do not). Returns (x, the takers' names)."""
    takers = ["t", "u", "v"]
    return sharing_cluster(["o"] + takers), takers


def owners_of(x, names):
    """{queue: its primary} as x's API says."""
    return {n: (queue_info(x, n) or {}).get("primary") for n in names}


def adopted(taker, names):
    """Whether the taker's log says it took over each of names."""
    log = members[taker].log_text()
    return all("queue '%s': took over" % n in log for n in names)


@test(timeout=300)
@noting_failure
def a_chain_of_three_takers_dying_before_their_copies_loses_nothing():
    """A cluster of its own: x, y and z (a Raft majority of seven) do not
    share the directory; o, t, u and v do. The journal threads of t, u and
    v are frozen (ptrace: what they copy never reaches their own logs). o
    dies with 12 queues of confirmed persistent messages and no backups;
    the taker with most of them (X1) is killed once it adopted; the one of
    the two left that got most of X1's is killed once it adopted them (X2):
    the third (X3) takes X2's over, its journal thawed. The map names X2
    and X1 (taken_from, taken_from_before); the only durable copy of o's
    log of a queue that went o -> X1 -> X2 -> X3 is the one X2 claimed from
    X1's adopted/ into its own: X3 reads it too. Every confirmed message is
    served. (Before, X3 read X2's and X1's logs, both empty, and served
    those queues empty.)"""
    x, takers = seven_with_takers()
    names = place(x, "chain", "o", 12)
    for name in names:
        publish(x, name, [b"%s-%d" % (name.encode(), i) for i in range(50)])
    time.sleep(0.3)  # group commit: every confirm's record is in o's logs
    frozen = {}
    owners = functools.partial(owners_of, x)
    try:
        for name in takers:
            frozen[name] = freeze_journal(members[name])
        members["o"].kill()
        wait_until(lambda: all(p in takers for p in owners(names).values()), 30,
                   what="o's queues taken over")
        first = owners(names)
        x1 = max(takers, key=lambda t: sum(1 for p in first.values() if p == t))
        via_x1 = [n for n in names if first[n] == x1]
        wait_until(lambda: adopted(x1, via_x1), 30, what="%s adopted" % x1)
        time.sleep(1)  # (a queue.adopted said too early commits)
        kill_frozen(members[x1], frozen.pop(x1))
        left = [t for t in takers if t != x1]
        wait_until(lambda: all(p in left for p in owners(via_x1).values()), 30,
                   what="%s's queues taken over" % x1)
        second = owners(via_x1)
        x2 = max(left, key=lambda t: sum(1 for p in second.values() if p == t))
        x3 = [t for t in left if t != x2][0]
        chain = [n for n in via_x1 if second[n] == x2]
        assert chain, "none of %s's queues went to %s" % (x1, x2)
        wait_until(lambda: adopted(x2, chain), 30, what="%s adopted" % x2)
        time.sleep(1)
        kill_frozen(members[x2], frozen.pop(x2))
        ptrace(PTRACE_DETACH, frozen.pop(x3))
        wait_until(lambda: all(p == x3 for p in owners(names).values()), 30,
                   what="every queue on %s" % x3)
        wait_until(lambda: metric(members[x3], "quay_cluster_adoptions_pending") == 0, 20,
                   what="%s's adoptions done" % x3)
        print("# o -> %s -> %s -> %s: %d queue(s) of o's through both dead takers"
              % (x1, x2, x3, len(chain)))
    finally:
        for name, tid in frozen.items():
            ptrace(PTRACE_DETACH, tid)
    bad = {}
    for name in names:
        got = read_all(x, name)
        if got != [b"%s-%d" % (name.encode(), i) for i in range(50)]:
            bad[name] = len(got)
    assert not bad, "messages served, of 50 (%s went through the chain): %s" % (chain, bad)
    log = members[x3].log_text()
    for name in chain:
        assert ("queue '%s': took over 50 messages from o's log, staged by a taker that died"
                % name) in log, name



@test(timeout=300)
@noting_failure
def a_chain_whose_middle_taker_never_adopted_loses_nothing():
    """A cluster of its own, as the chain of three: x, y and z do not
    share the directory; o, t, u and v do, the journal threads of t, u and
    v frozen. o dies with 24 queues; the taker with most (X1) adopts its
    share (o's logs staged in its adopted/, never synced); the two others
    are stopped (SIGSTOP: still up in the map for a second) and X1 killed
    at once: X1's queues go to them; the one that got most (S) stays
    stopped and never adopts them, the other (R) goes on at once. S is
    killed; R (thawed) takes S's over: the map names S, then X1,
    then o (taken_from, taken_from_before, taken_older). The only copy of
    o's log of a queue that went o -> X1 -> S -> R is in X1's adopted/,
    which R now reads. Every confirmed message is served. (Before, the map
    kept two names and R looked in S's adopted/ only: those queues were
    served empty.)"""
    x, takers = seven_with_takers()
    names = place(x, "middle", "o", 24)
    # The others place() declared go: with the brokers' shares small, the
    # ring alone (not the placement bound) picks X1's queues' next takers,
    # so about half of them go to the stopped one.
    conn = connect(x)
    for info in x.api_get("/api/queues", timeout=10):
        if info["name"].startswith("middle-") and info["name"] not in names:
            conn.channel().queue_delete(info["name"])
    conn.close()
    for name in names:
        publish(x, name, [b"%s-%d" % (name.encode(), i) for i in range(30)])
    time.sleep(0.3)  # group commit: every confirm's record is in o's logs
    frozen = {}
    owners = functools.partial(owners_of, x)
    stopped = None
    try:
        for name in takers:
            frozen[name] = freeze_journal(members[name])
        members["o"].kill()
        wait_until(lambda: all(p in takers for p in owners(names).values()), 30,
                   what="o's queues taken over")
        first = owners(names)
        for t in takers:
            share = [n for n in names if first[n] == t]
            wait_until(lambda: adopted(t, share), 30, what="%s adopted" % t)
        x1 = max(takers, key=lambda t: sum(1 for p in first.values() if p == t))
        via_x1 = [n for n in names if first[n] == x1]
        time.sleep(1)  # (a queue.adopted said too early commits)
        left = [t for t in takers if t != x1]
        # Both stopped (up in the map for a second): X1's queues go to
        # either, by the ring and the placement bound; the one that got
        # most stays stopped (S), the other (R) goes on at once.
        for t in left:
            os.kill(members[t].proc.pid, signal.SIGSTOP)
        stopped = left
        kill_frozen(members[x1], frozen.pop(x1))
        wait_until(lambda: all(p in left for p in owners(via_x1).values()), 0.8,
                   what="%s's queues taken over" % x1)
        second = owners(via_x1)
        stopped, r = sorted(left, key=lambda t: -sum(1 for p in second.values() if p == t))
        os.kill(members[r].proc.pid, signal.SIGCONT)
        middle = [n for n in via_x1 if second[n] == stopped]
        os.kill(members[stopped].proc.pid, signal.SIGKILL)
        os.waitpid(frozen.pop(stopped), WALL)
        members[stopped].proc.wait(10)
        ptrace(PTRACE_DETACH, frozen.pop(r))
        wait_until(lambda: all(p == r for p in owners(names).values()), 30,
                   what="every queue on %s" % r)
        wait_until(lambda: metric(members[r], "quay_cluster_adoptions_pending") == 0, 20,
                   what="%s's adoptions done" % r)
        print("# o -> %s -> %s (stopped, never adopted) -> %s: %d queue(s)"
              % (x1, stopped, r, len(middle)))
    finally:
        for name, tid in frozen.items():
            ptrace(PTRACE_DETACH, tid)
        for t in ([stopped] if isinstance(stopped, str) else stopped or []):
            if members[t].alive():
                os.kill(members[t].proc.pid, signal.SIGCONT)
    bad = {}
    for name in names:
        got = read_all(x, name)
        if got != [b"%s-%d" % (name.encode(), i) for i in range(30)]:
            bad[name] = len(got)
    assert not bad, "messages served, of 30 (%s went through %s): %s" % (middle, stopped, bad)
    log = members[r].log_text()
    for name in middle:
        assert ("queue '%s': took over 30 messages from o's log, staged by a taker that died"
                % name) in log, name

def refused(member, how):
    """The reply code and text member's channel closes with when how(ch)
    runs, or None if nothing refused it."""
    conn = connect(member)
    ch = conn.channel()
    try:
        how(ch)
        return None
    except pika.exceptions.ChannelClosedByBroker as e:
        return e.reply_code, e.reply_text
    finally:
        if conn.is_open:
            conn.close()


def nacked(member, queue):
    """Whether a confirmed persistent publish to queue through member is
    nacked (True) or confirmed (False)."""
    conn = connect(member)
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("", queue, b"refused?", PERSISTENT)
        return False
    except pika.exceptions.NackError:
        return True
    finally:
        conn.close()


@test(timeout=240)
@noting_failure
def a_log_that_cannot_be_read_keeps_its_queue_unavailable_until_it_can():
    """c dies; one segment of its queue's log is unreadable (a directory
    where the file was: every read of it fails with EISDIR, as a failing
    disk's would with EIO). The taker does not serve the queue without
    those messages: through it and through a proxy, gets, consumes and
    passive declares are refused 404 and publishes nacked, the API says
    "down" on every broker; once the segment reads again the taker's next try (1 s, 2 s,
    4 s, ... apart) adopts it, and every confirmed message is served once,
    in order, followed by what is published after."""
    a, b, c = own_cluster(["a", "b", "c"])
    name = place(a, "unreadable", "c", 1)[0]
    bodies = [b"%s-%d" % (name.encode(), i) for i in range(300)]
    publish(a, name, bodies)
    time.sleep(0.3)  # group commit: every confirm's record is in c's log
    log = log_dir_of("c", name)
    segments = sorted(f for f in os.listdir(log) if f.endswith(".seg"))
    assert segments, os.listdir(log)
    broken = segments[0]
    os.kill(c.proc.pid, signal.SIGSTOP)  # (nothing more written, then gone)
    with open(os.path.join(log, broken), "rb") as f:
        saved = f.read()
    os.unlink(os.path.join(log, broken))
    os.mkdir(os.path.join(log, broken))
    c.kill()
    wait_until(lambda: queue_info(a, name) and queue_info(a, name)["primary"] in ("a", "b"),
               30, what="%s taken over" % name)
    taker = members[queue_info(a, name)["primary"]]
    proxy = b if taker is a else a
    wait_until(lambda: "the log it was taken over from cannot be read whole" in
               taker.log_text(), 20, what="%s's adoption failed" % taker.name)
    for via in (taker, proxy):
        for what, how in (("get", lambda ch: ch.basic_get(name)),
                          ("consume", lambda ch: ch.basic_consume(name, lambda *a: None)),
                          ("passive declare", lambda ch: ch.queue_declare(name, passive=True))):
            got = refused(via, how)
            assert got is not None and got[0] == 404 and "unavailable" in got[1], \
                (via.name, what, got)
        assert nacked(via, name), via.name
    for via in (taker, proxy):  # (the proxy asks the taker: queue.quay-counts' "down")
        assert next(q for q in via.api_get("/api/queues") if q["name"] == name)["state"] == \
            "down", via.name
    assert metric(taker, "quay_cluster_adoptions_unreadable") == 1
    # The segment reads again, wherever the takeover staged it.
    moved = [os.path.join(root, d) for root, dirs, _ in os.walk(shared) for d in dirs
             if d == broken]
    assert len(moved) == 1, moved
    os.rmdir(moved[0])
    with open(moved[0], "wb") as f:
        f.write(saved)
    wait_until(lambda: metric(taker, "quay_cluster_adoptions_unreadable") == 0, 40,
               what="%s's adoption tried again" % taker.name)
    assert "is read whole at last: available" in taker.log_text()
    for via in (taker, proxy):
        assert next(q for q in via.api_get("/api/queues") if q["name"] == name)["state"] == \
            "running", via.name
    got = read_all(proxy, name)
    assert got == bodies, (len(got), got[:3], got[-3:])
    publish(proxy, name, [b"after-%d" % i for i in range(20)])
    assert read_all(taker, name) == [b"after-%d" % i for i in range(20)]


@test(timeout=240)
@noting_failure
def a_log_bigger_than_memory_is_adopted_with_its_tail_on_disk():
    """--memory-high-watermark 64MiB: c's queue holds 256 MiB of confirmed
    persistent messages (c pages them out as they come); c dies. The taker
    reads the log in steps (durable_adopt_step: a segment or a message at
    a time, ADOPTION_SLICE_MS a loop turn), so no turn of its loop lasts
    long (read in one turn, as before, the longest was the whole read:
    0.8 s here under ASan, where a broker silent for 2 s is declared
    down); it adopts the log with most of it paged out to its own log, and
    every message is served once, in order, read back from there. (That it
    pages and waits for its journal's writer while it reads, rather than
    hold the whole log until the alarm's next tick, shows in the peak
    memory only: bench/takeover_memory.py, release build; under ASan the
    allocator's quarantine keeps freed memory resident.)"""
    a, b, c = own_cluster(["a", "b", "c"], extra=["--memory-high-watermark", "64MiB"])
    name = place(a, "deep", "c", 1)[0]
    body = b"d" * 65536
    count = 4096
    publish(a, name, [b"%d " % i + body for i in range(count)])
    time.sleep(0.3)  # group commit: every confirm's record is in c's log
    c.kill()
    wait_until(lambda: queue_info(a, name) and queue_info(a, name)["primary"] in ("a", "b"),
               30, what="%s taken over" % name)
    taker = members[queue_info(a, name)["primary"]]
    other = b if taker is a else a
    wait_until(lambda: metric(taker, "quay_cluster_adoptions_pending") == 0, 60,
               what="%s adopted" % name)
    lag = metric(taker, "quay_event_loop_lag_seconds")  # (its last 5-10 s)
    print("# adopted by %s: its longest loop turn meanwhile %.3f s" % (taker.name, lag))
    assert lag < 0.6, lag
    paged = next(q for q in taker.api_get("/api/queues") if q["name"] == name)["paged"]
    assert paged > count // 2, paged
    got = read_all(other, name)
    assert len(got) == count and all(m == b"%d " % i + body for i, m in enumerate(got)), \
        (len(got), [m[:8] for m in got[:3]])


if __name__ == "__main__":
    run(cleanup=closer(lambda: cluster))
