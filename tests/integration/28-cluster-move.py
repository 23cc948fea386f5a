"""Goal: a queue moves to another broker while it serves (POST
/api/cluster/move, quayctl move), and its clients cannot tell: a
confirming publisher and an acking consumer on two other brokers go on
through the move with every message confirmed once, none nacked, none lost,
none delivered twice, in order, and the consumer is never cancelled. A move
to a broker that is not a backup catches it up first. A request that cannot
be carried out (unknown queue or broker, the primary itself, a broker that
is down, a malformed body) is refused and changes nothing.

Method: three quayd processes (tests/cluster/clustertest.py); pika clients
in threads; the map read from GET /api/queues and /api/cluster.
"""
import http.client
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, api_authorization, closer, connect,  # noqa: E402
                         declare_until, kill_at, metric,
                         queue_info, quayd_path, read_all, run, test, wait_until)
from loadclients import Consumer, Publisher, in_order  # noqa: E402

import pika  # noqa: E402

cluster = None
members = {}


def post_move(member, body):
    """POSTs body (bytes) to member's /api/cluster/move: (status, JSON)."""
    return member.api_call("POST", "/api/cluster/move", body, timeout=5)


def move(member, queue, to):
    status, body = post_move(member, json.dumps({"vhost": "/", "queue": queue,
                                                 "to": to}).encode())
    assert status == 202, (status, body)
    return body


def quayctl(member, *args):
    ctl = os.path.join(os.path.dirname(quayd_path()), "quayctl")
    return subprocess.run([ctl, "--http", "127.0.0.1:%d" % member.http_port] + list(args),
                          capture_output=True, text=True, timeout=10)


def queue_roles(member, queue):
    """The roles member's GET /metrics gives queue (quay_queue_role)."""
    c = http.client.HTTPConnection("127.0.0.1", member.http_port, timeout=10)
    try:
        c.request("GET", "/metrics", headers={"Authorization": api_authorization()})
        text = c.getresponse().read().decode()
    finally:
        c.close()
    pattern = r'^quay_queue_role\{vhost="/",queue="%s",role="(\w+)"\} 1$' % re.escape(queue)
    return set(re.findall(pattern, text, re.M))


def others(*names):
    return [m for n, m in members.items() if n not in names]


@test(timeout=120)
def three_brokers():
    global cluster
    cluster = Cluster()
    for m in cluster.form(["a", "b", "c"]):
        members[m.name] = m


@test(timeout=60)
def refused_requests_change_nothing():
    a = members["a"]
    q = declare_until("mv-r", a, lambda i: i is not None, **{"x-quay-backups": 1})
    info = queue_info(a, q)
    cases = [
        (b'{"queue": "nope", "to": "b"}', 404),
        (json.dumps({"queue": q, "to": "zz"}).encode(), 404),
        (json.dumps({"queue": q, "to": info["primary"]}).encode(), 409),
        (json.dumps({"vhost": "nope", "queue": q, "to": "b"}).encode(), 404),
        (b"", 400), (b"{", 400), (b"[]", 400), (b'{"queue": "x"}', 400),
        (json.dumps({"queue": q, "to": 3}).encode(), 400),
        (json.dumps({"queue": q, "to": "b", "extra": 1}).encode(), 400),
    ]
    for body, want in cases:
        status, answer = post_move(a, body)
        assert status == want and answer.get("error"), (body, status, answer)
    out = quayctl(a, "move", q)
    assert out.returncode == 64 and "--to" in out.stderr, (out.returncode, out.stderr)
    out = quayctl(a, "move", q, "--to", info["primary"])
    assert out.returncode == 76 and "409" in out.stderr, (out.returncode, out.stderr)
    assert queue_info(a, q) == info
    assert a.api_cluster()["moves"] == []


@test(timeout=120)
def a_move_is_in_the_map_when_it_is_answered():
    """The 202 of POST /api/cluster/move means the move is recorded: a GET
    of /api/cluster on the broker that answered, sent right after, lists it
    (or, already carried out, the queue's new primary shows it). Asked six
    times, through each broker in turn, each time to the broker that holds
    nothing of the queue (a catch-up first, so the move lasts a while)."""
    q = declare_until("mv-seen", members["a"],
                      lambda i: i is not None and len(i["backups"]) == 1, **{"x-quay-backups": 1})
    conn = connect(members["a"])
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", q, b"x" * 1024)
    conn.close()
    for round in range(6):
        via = members["abc"[round % 3]]
        info = queue_info(via, q)
        target = next(m.name for m in others(info["primary"], *info["backups"]))
        answer = move(via, q, target)
        cluster = cluster_info(via)
        listed = [m for m in cluster["moves"] if m["queue"] == q and m["to"] == target]
        primary = via.api_call("GET", "/api/queues/%2F/" + q)[1].get("primary")
        assert listed or primary == target, (round, via.name, answer, cluster["moves"], primary)
        wait_until(lambda: queue_info(members["a"], q)["primary"] == target and
                   not cluster_info(members["a"])["moves"], 30, what="the move to %s" % target)
        # Every broker's scrape follows the map (metrics_cluster.c keeps
        # each queue's map entry between scrapes while the map is unchanged:
        # a kept entry must not outlive a change): the new primary says so,
        # and so does every other broker's role for the queue.
        wait_until(lambda: all(queue_roles(m, q) == {"primary" if m.name == target else
                                                     "backup" if m.name in queue_info(
                                                         m, q)["backups"] else "proxy"}
                               for m in members.values()), 10, what="the roles scraped")
    # The route takes POST of its own path only.
    assert members["a"].api_call("GET", "/api/cluster/move")[0] == 405
    status, body = members["a"].api_call("POST", "/api/cluster/move/x", b"{}")
    assert (status, body) == (404, {"error": "Object Not Found", "reason": "Not Found"}), body


def move_under_load(to_backup):
    """A queue on one broker, a publisher and a consumer on each broker;
    moved while they run to another broker (a backup already, or not), and
    back: every confirmed message is delivered once, in each publisher's
    order, nothing is nacked, nobody is cancelled."""
    q = declare_until("mv-%s" % ("b" if to_backup else "n"), members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    primary = first["primary"]
    target = next(m.name for m in others(primary) if (m.name in first["backups"]) == to_backup)
    pubs = [Publisher(m.name, m, q, rate=150) for m in members.values()]
    cons = [Consumer(m, q) for m in members.values()]
    for t in cons + pubs:
        t.start()
    time.sleep(1.0)
    moves_before = {m.name: metric(m, "quay_cluster_queue_moves_total") for m in members.values()}
    answer = move(members[primary], q, target)
    assert answer["from"] == primary and answer["catch_up"] == (not to_backup), answer
    wait_until(lambda: queue_info(members["a"], q)["primary"] == target, 20,
               what="the move to %s" % target)
    time.sleep(1.0)
    # And back, with quayctl.
    out = quayctl(members[target], "move", q, "--to", primary)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    wait_until(lambda: queue_info(members["a"], q)["primary"] == primary, 20,
               what="the move back")
    # Every broker counted both handovers (and any rebalancing), no failover.
    for m in members.values():
        moved = metric(m, "quay_cluster_queue_moves_total") - moves_before[m.name]
        assert moved >= 2, (m.name, moved)
    time.sleep(1.0)
    for p in pubs:
        p.stopping.set()
    for p in pubs:
        p.join(30)
    confirmed = set(b for p in pubs for b in p.confirmed)
    wait_until(lambda: len(set(b for c in cons for b in c.got)) >= len(confirmed), 20,
               what="every confirmed message delivered")
    time.sleep(0.5)
    for c in cons:
        c.stopping.set()
    for c in cons:
        c.join(30)
    got = [b for c in cons for b in c.got]
    dups = len(got) - len(set(got))
    print("# %s: %d confirmed, %d nacked, %d delivered (%d twice, %d redelivered), longest "
          "confirm wait %.0f ms" % (q, len(confirmed), sum(len(p.nacked) for p in pubs),
                                    len(got), dups, sum(c.redelivered for c in cons),
                                    max(p.longest for p in pubs) * 1000))
    if dups or not all(in_order(c.got) for c in cons):
        for c in cons:
            print("# through %s: %s" % (c.member.name, [b for b in c.got if got.count(b) > 1]))
            print("#   order breaks: %s" % [(a, b) for a, b in zip(c.got, c.got[1:])
                                           if a.rsplit(b"-", 1)[0] == b.rsplit(b"-", 1)[0]
                                           and int(a.rsplit(b"-", 1)[1]) >
                                           int(b.rsplit(b"-", 1)[1])][:5])
    if max(p.longest for p in pubs) > 1.0:
        cluster.failed = True  # keep the logs: a confirm waited a second
    for t in pubs + cons:
        assert not t.errors, t.errors
    for p in pubs:
        assert not p.nacked, p.nacked[:10]
    for c in cons:
        assert not c.cancelled
        assert in_order(c.got), "out of order through %s" % c.member.name
    assert set(got) >= confirmed
    assert dups == 0, dups
    wait_until(lambda: queue_info(members["a"], q)["in_sync"] == queue_info(members["a"], q)[
        "backups"] and len(queue_info(members["a"], q)["backups"]) == 1, 20,
        what="the factor back")
    assert read_all(members[target], q) == []
    assert members["a"].api_cluster()["moves"] == []


@test(timeout=180)
def a_move_to_a_backup_under_load_is_invisible():
    move_under_load(True)


@test(timeout=180)
def a_move_to_another_broker_catches_it_up_first():
    move_under_load(False)


@test(timeout=120)
def a_backup_moves_under_load_and_the_primary_stays():
    """quayctl move Q --to T --backup-of B: T (not holding Q) catches up
    while a publisher and a consumer go on, then B lets go; the primary
    never changes and the queue keeps one backup, in sync."""
    q = declare_until("mv-bk", members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    primary, backup = first["primary"], first["backups"][0]
    target = next(m.name for m in others(primary, backup))
    a = members[primary]
    for body, want in (({"queue": q, "to": target, "backup_of": target}, 409),
                       ({"queue": q, "to": backup, "backup_of": backup}, 409),
                       ({"queue": q, "to": target, "backup_of": "zz"}, 404),
                       ({"queue": q, "to": target, "backup_of": 3}, 400)):
        status, answer = post_move(a, json.dumps(body).encode())
        assert status == want and answer.get("reason"), (body, status, answer)
    fill(members[backup], q, 500)
    pubs = [Publisher(m.name, m, q, rate=150) for m in members.values()]
    con = Consumer(members[target], q)
    con.start()
    for p in pubs:
        p.start()
    time.sleep(1.0)
    out = quayctl(a, "--json", "move", q, "--to", target, "--backup-of", backup)
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert json.loads(out.stdout)["kind"] == "backup", out.stdout
    wait_until(lambda: queue_info(a, q)["backups"] == [target] and
               queue_info(a, q)["in_sync"] == [target] and a.api_cluster()["moves"] == [], 20,
               what="the backup moved", detail=lambda: (queue_info(a, q), a.api_cluster()["moves"]))
    time.sleep(0.5)
    for p in pubs:
        p.stopping.set()
        p.join(30)
    confirmed = [b for p in pubs for b in p.confirmed]
    wait_until(lambda: set(con.got) >= set(confirmed), 20, what="everything delivered")
    con.stopping.set()
    con.join(30)
    assert all(not p.errors and not p.nacked for p in pubs), [(p.errors, p.nacked) for p in pubs]
    assert not con.errors and not con.cancelled, con.errors
    mine = [b for b in con.got if not b[:1].isdigit()]
    assert len(mine) == len(set(mine)) and in_order(mine)
    assert queue_info(a, q)["primary"] == primary
    got = sorted(int(b.split(b"-", 1)[0]) for b in con.got if b[:1].isdigit())
    assert got == list(range(500)), len(got)


@test(timeout=120)
def gets_during_a_move_wait_and_find_every_message():
    """basic.get on the old primary and through a proxy while the queue
    moves: a get that comes while the queue stands still waits, and is
    answered where the queue then is; no get finds the queue empty while it
    holds messages, and every message is got exactly once."""
    q = declare_until("mv-get", members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    primary, backup = first["primary"], first["backups"][0]
    n = 4000
    fill(members[backup], q, n, size=16)
    got, empties, errors = [], [], []
    start = threading.Event()

    def getter(member):
        try:
            conn = connect(member)
            ch = conn.channel()
            start.wait()
            while len(got) < n:
                m, _, body = ch.basic_get(q, auto_ack=True)
                if m is None:
                    empties.append((member.name, len(got)))
                    if len(empties) > 100:
                        return
                    time.sleep(0.01)
                else:
                    got.append(body)
            conn.close()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=getter, args=(m,), daemon=True)
               for m in (members[primary], members[others(primary, backup)[0].name])]
    for t in threads:
        t.start()
    start.set()
    time.sleep(0.2)
    move(members[primary], q, backup)
    for t in threads:
        t.join(60)
    print("# %d got, %d empty answers" % (len(got), len(empties)))
    assert not errors, errors
    assert queue_info(members[primary], q)["primary"] == backup
    # (At the very end the other getter may have taken the last ones.)
    early = [e for e in empties if e[1] < n - 2]
    assert not early, early[:10]
    assert sorted(int(b.split(b"-", 1)[0]) for b in got) == list(range(n)), len(got)


@test(timeout=180)
def transactions_commit_across_moves():
    """A transactional publisher on each broker commits batches of three
    while the queue moves from broker to broker: a commit that comes while
    the queue stands still for a switch waits, its publishes are held and
    routed where the queue then is, and it is answered commit-ok; every
    committed message is in the queue once. Before, routing a held
    transactional publish took it for a confirm and failed an assertion
    (channel.c sink_wait): the broker that held it died."""
    q = declare_until("mv-tx", members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    stop = threading.Event()
    errors, committed = [], {m: [] for m in members}

    def publisher(member):
        try:
            conn = connect(member)
            ch = conn.channel()
            ch.tx_select()
            n = 0
            while not stop.is_set():
                batch = [b"%s-%d" % (member.name.encode(), n + i) for i in range(3)]
                for body in batch:
                    ch.basic_publish("", q, body)
                ch.tx_commit()
                committed[member.name] += batch
                n += 3
            conn.close()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append((member.name, repr(e)))
    threads = [threading.Thread(target=publisher, args=(m,), daemon=True)
               for m in members.values()]
    for t in threads:
        t.start()
    try:
        for _ in range(6):
            info = queue_info(members["a"], q)
            to = next(m for m in others(info["primary"]) if m.name in info["in_sync"])
            move(members["a"], q, to.name)
            wait_until(lambda: (queue_info(members["a"], q) or {}).get("primary") == to.name
                       and members["a"].api_cluster()["moves"] == [], 20, what="the move")
            time.sleep(0.2)  # (commits at the new primary, then the next move)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert all(m.alive() for m in members.values()), "a broker died"
    want = sorted(b for bodies in committed.values() for b in bodies)
    got = sorted(read_all(members["b"], q))
    print("# %d messages committed in %d transactions across 6 moves" % (len(want),
                                                                         len(want) // 3))
    assert len(want) > 0 and got == want, (len(got), len(want),
                                           sorted(set(want) - set(got))[:5])


@test(timeout=120)
def listings_during_moves_never_miss_the_queue():
    """GET /api/queues and /api/queues/%2F/NAME on the brokers a queue moves
    to and from, asked without pause while it moves back and forth: every
    answer shows the queue (a listing that waits for a primary's counts
    while the queue changes hands answers with what stands under the name
    then; it once left the queue out)."""
    q = declare_until("mv-list", members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    ends = [first["primary"], first["backups"][0]]
    fill(members[ends[0]], q, 200, size=64)
    misses, answers, errors = [], [], []
    stop = threading.Event()

    def poller(member, single):
        try:
            while not stop.is_set():
                if single:
                    try:
                        info = member.api_get("/api/queues/%2F/" + q, timeout=5)
                    except Exception as e:  # noqa: BLE001 (a 404 is a miss)
                        misses.append((member.name, "single", repr(e)))
                        continue
                    seen = [info]
                else:
                    seen = [i for i in member.api_get("/api/queues", timeout=5) if i["name"] == q]
                answers.append(1)
                if len(seen) != 1 or seen[0]["messages"] != 200:
                    misses.append((member.name, "list", seen))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=poller, args=(members[n], single), daemon=True)
               for n in ends for single in (False, True)]
    for t in threads:
        t.start()
    for i in range(6):
        to = ends[(i + 1) % 2]
        move(members[ends[i % 2]], q, to)
        wait_until(lambda: all(queue_info(members[n], q)["primary"] == to for n in ends), 20,
                   what="the move to %s seen on both" % to)
        wait_until(lambda: queue_info(members[to], q)["in_sync"] ==
                   queue_info(members[to], q)["backups"], 20, what="its backup in sync")
    stop.set()
    for t in threads:
        t.join(10)
    print("# %d answers during 6 moves" % len(answers))
    assert not errors, errors
    assert not misses, misses[:5]


def fill(via, queue, n, size=1024):
    """n persistent messages, confirmed, through via."""
    conn = connect(via)
    ch = conn.channel()
    ch.confirm_delivery()
    pad = b"x" * size
    for i in range(n):
        ch.basic_publish("", queue, b"%d-" % i + pad, pika.BasicProperties(delivery_mode=2))
    conn.close()


def move_with_a_death(victim_is_target):
    """A deep queue moved to a broker that is not its backup; the target
    (or the source) is killed while it catches up. The map ends consistent
    (no move left, the factor back) and nothing confirmed is lost."""
    q = declare_until("mv-k%s" % ("t" if victim_is_target else "s"), members["a"],
               lambda i: i is not None and len(i["backups"]) == 1 and i["in_sync"] ==
               i["backups"], **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    primary = first["primary"]
    target = next(m.name for m in others(primary) if m.name not in first["backups"])
    backup = first["backups"][0]
    fill(members[backup], q, 20000)
    survivor = members[backup]
    before = survivor.api_cluster()["moves"]  # none: counted once for this map version
    move(survivor, q, target)
    # The move is listed once the map has it (20,000 messages take a while
    # to catch up): /api/cluster counts moves once per map version
    # (node_shares), and a count kept from before must not hide it.
    assert before == [], before
    wait_until(lambda: [(m["queue"], m["to"]) for m in survivor.api_cluster()["moves"]] ==
               [(q, target)], 5, what="the move listed")
    victim = members[target if victim_is_target else primary]
    failovers_before = metric(survivor, "quay_cluster_queue_failovers_total")
    victim.kill()
    wait_until(lambda: survivor.view().brokers.get(victim.name) == "down", 15,
               what="%s down" % victim.name)
    wait_until(lambda: survivor.api_cluster()["moves"] == [], 15, what="the move ended")
    info = queue_info(survivor, q)
    assert info["primary"] != victim.name, info
    if not victim_is_target:  # q failed over (and whatever else the victim held)
        assert metric(survivor, "quay_cluster_queue_failovers_total") > failovers_before
    bodies = read_all(survivor, q)
    got = set(int(b.split(b"-", 1)[0]) for b in bodies)
    assert got == set(range(20000)), (len(got), len(bodies))
    victim.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(victim.name) == "up"
                           for m in members.values()), 30, what="%s back" % victim.name)
    wait_until(lambda: queue_info(survivor, q)["in_sync"] == queue_info(survivor, q)[
        "backups"] and len(queue_info(survivor, q)["backups"]) == 1, 30, what="the factor back")


@test(timeout=180)
def a_target_that_dies_ends_the_move():
    move_with_a_death(True)


@test(timeout=180)
def a_source_that_dies_fails_over_as_usual():
    move_with_a_death(False)


@test(timeout=180)
def a_queue_without_backups_outlives_a_target_that_dies_at_the_switch():
    """A queue without backups (x-quay-backups 0) moved: until the switch
    its target is its only backup. The switch keeps the old primary as an
    in-sync backup, beyond the factor, until the new primary has applied it
    (map_queue_switch_keeps_primary, controller_round): a target that dies
    as the switch commits (gdb kills it at its promotion's first step) is
    failed over to the old primary, with every message, transient ones too.
    Before, the old primary let its copy go at the switch, and the queue's
    transient messages died with a broker they had not depended on (tests/
    sim --strict seeds 617, 2975, 3799)."""
    q = declare_until("mv-z", members["a"],
                      lambda i: i is not None and i["backups"] == [] and i["primary"] != "a",
                      **{"x-quay-backups": 0})
    primary = members[queue_info(members["a"], q)["primary"]]
    target = next(m for m in others(primary.name) if m.name != "a")
    via = members["a"]
    conn = connect(via)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(30):
        ch.basic_publish("", q, b"%d" % i)  # transient
    conn.close()
    gdb = kill_at(target, "proxy_stub_take_replica")
    try:
        move(via, q, target.name)
        out = gdb.communicate(timeout=60)[0]
        assert "proxy_stub_take_replica" in out and "killed" in out, out
        assert target.proc.wait(10) == -9
        wait_until(lambda: (queue_info(via, q) or {}).get("primary") == primary.name and
                   (queue_info(via, q) or {}).get("messages") == 30, 20,
                   what="the old primary to take the queue back with its 30 messages",
                   detail=lambda: queue_info(via, q))
        got = []

        def read():  # (through via's stand-in, once its link to the primary is up)
            try:
                got[:] = [int(body) for body in read_all(via, q)]
                return True
            except pika.exceptions.ChannelClosedByBroker:
                return False
        wait_until(read, 20, what="the queue read through %s" % via.name)
        assert got == list(range(30)), got
    finally:
        if gdb.poll() is None:
            gdb.kill()
            gdb.wait()
        if not target.alive():
            target.start()
    wait_until(lambda: all(m.view() and set(m.view().brokers.values()) == {"up"}
                           for m in members.values()), 30, what="all three back")


def queue_log_bytes(member, queue):
    """The size of queue's log in member's journal (its segments), found by
    the name in each log's header file (store/format.h); None: no log."""
    root = os.path.join(member.data, "queues")
    for leaf in os.listdir(root) if os.path.isdir(root) else []:
        path = os.path.join(root, leaf)
        if ".deleted-" in leaf:
            continue  # (being removed)
        try:
            with open(os.path.join(path, "queue"), "rb") as f:
                header = f.read()
            segments = [f for f in os.listdir(path) if f.endswith(".seg")]
        except OSError:  # (deleted meanwhile)
            continue
        # (32 bytes of file header, 16 of record header, then the payload:
        # u32 vhost size, vhost, name)
        size, = struct.unpack_from("<I", header, 36)
        vhost_size, = struct.unpack_from("<I", header, 48)
        if header[52 + vhost_size:48 + size] == queue.encode():
            return sum(os.path.getsize(os.path.join(path, f)) for f in segments)
    return None


@test(timeout=180)
def a_released_old_primary_lets_go_of_its_copy():
    """A queue without backups (x-quay-backups 0) holding 2,000 persistent
    messages moved: the switch keeps the old primary as an in-sync backup
    until the new primary has applied it, then the repair releases it
    (release_surplus). Released, the map no longer names it a backup, and
    it lets go of its copy: no message in memory (replica_messages 0), no
    log on disk. Before, it kept both, stale, until the queue was deleted.
    Moved back, it is caught up from a reset first (as any new backup) and
    serves every message, those published while it held nothing too."""
    q = declare_until("mv-f", members["a"],
                      lambda i: i is not None and i["backups"] == [] and i["primary"] != "a",
                      **{"x-quay-backups": 0})
    old = members[queue_info(members["a"], q)["primary"]]
    target = next(m for m in others(old.name) if m.name != "a")
    via = members["a"]
    fill(via, q, 2000)
    wait_until(lambda: (queue_log_bytes(old, q) or 0) > 2000 * 1024, 10,
               what="the queue's log on %s" % old.name)
    move(via, q, target.name)
    wait_until(lambda: (lambda i: i["primary"] == target.name and i["backups"] == [])(
        queue_info(via, q)) and via.api_cluster()["moves"] == [], 30,
        what="the move, and the old primary released", detail=lambda: queue_info(via, q))
    wait_until(lambda: (lambda i: i["role"] == "proxy" and i["replica_messages"] == 0)(
        queue_info(old, q)), 10, what="%s to let go of its copy" % old.name,
        detail=lambda: queue_info(old, q))
    wait_until(lambda: queue_log_bytes(old, q) is None, 10,
               what="%s to delete its copy's log" % old.name,
               detail=lambda: queue_log_bytes(old, q))
    # Published while it holds nothing: a catch-up must bring them too.
    conn = connect(via)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(2000, 2100):
        ch.basic_publish("", q, b"%d-" % i, pika.BasicProperties(delivery_mode=1 + i % 2))
    conn.close()
    move(via, q, old.name)
    wait_until(lambda: (lambda i: i["primary"] == old.name and i["backups"] == [])(
        queue_info(via, q)) and via.api_cluster()["moves"] == [], 30,
        what="the move back", detail=lambda: queue_info(via, q))
    wait_until(lambda: (queue_info(target, q) or {}).get("replica_messages") == 0, 10,
               what="%s to let go of its copy" % target.name, detail=lambda: queue_info(target, q))
    got = [int(b.split(b"-", 1)[0]) for b in read_all(via, q)]
    assert got == list(range(2100)), (len(got), sorted(set(range(2100)) - set(got))[:20])


@test(timeout=180)
def deliveries_of_the_old_primary_outlive_the_new_one():
    """A consumer on the third broker holds unacked deliveries when its
    queue moves: its proxy keeps the channel to the old primary for them
    (their settles go through it). The new primary is then killed: that
    channel is not its, and stays; the client settles, leaves, and the old
    primary restarts later without harm. Nothing unacked is lost."""
    q = declare_until("mv-o", members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    primary, target = members[first["primary"]], members[first["backups"][0]]
    via = others(primary.name, target.name)[0]
    fill(via, q, 100, size=16)
    conn = connect(via)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    held = []
    for method, _, body in ch.consume(q, inactivity_timeout=10):
        assert method is not None, "only %d deliveries" % len(held)
        held.append((method.delivery_tag, int(body.split(b"-", 1)[0])))
        if len(held) == 10:
            break
    move(via, q, target.name)
    wait_until(lambda: queue_info(via, q)["primary"] == target.name and
               via.api_cluster()["moves"] == [], 20, what="the move")
    # The old primary let go of its copy: the factor was kept by a backup
    # that joined and caught up before the switch (map_queue_move_state).
    info = queue_info(via, q)
    assert len(info["in_sync"]) == 1 and info["in_sync"] == info["backups"], info
    for tag, _ in held[:2]:
        ch.basic_ack(tag)  # settled at the new primary, through the old one
    conn.process_data_events(0.2)
    target.kill()
    wait_until(lambda: via.view().brokers.get(target.name) == "down", 15,
               what="%s down" % target.name)
    wait_until(lambda: (queue_info(via, q) or {}).get("primary") not in (None, target.name),
               15, what="the failover", detail=lambda: queue_info(via, q))
    for tag, _ in held[2:5]:
        ch.basic_ack(tag)
    conn.close()  # the other five go back
    target.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(target.name) == "up"
                           for m in members.values()), 30, what="%s back" % target.name)
    primary.restart()  # the old channel's link goes down at via
    wait_until(lambda: all(m.view() and m.view().brokers.get(primary.name) == "up"
                           for m in members.values()), 30, what="%s back" % primary.name)
    assert via.alive() and via.sanitizer_report() == [], via.sanitizer_report()
    wait_until(lambda: (queue_info(via, q) or {}).get("available", True) and
               (queue_info(via, q) or {}).get("primary") is not None, 20, what="q served")
    got = [int(b.split(b"-", 1)[0]) for b in read_all(via, q)]
    assert len(got) == len(set(got)), got
    assert set(got) >= set(range(100)) - set(n for _, n in held[:5]), sorted(got)[:20]


def keeps_deliveries(consumer_on):
    """A consumer holding a full prefetch of unacked deliveries when its
    queue moves (consumer_on: "target", the broker the queue moves to, or
    "third", neither end): none of them comes again, before or after it is
    acked, and what follows comes once, in order, not flagged redelivered."""
    q = declare_until("mv-k%s" % consumer_on[0], members["a"],
               lambda i: i is not None and i["in_sync"] == i["backups"] and len(i["backups"]) == 1,
               **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    primary, target = members[first["primary"]], members[first["backups"][0]]
    via = target if consumer_on == "target" else others(primary.name, target.name)[0]
    fill(via, q, 300, size=16)
    conn = connect(via)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    seen = []

    def on_message(channel, method, props, body):
        seen.append((int(body.split(b"-", 1)[0]), method.redelivered, method.delivery_tag))
    ch.basic_consume(q, on_message)
    deadline = time.time() + 10
    while len(seen) < 50 and time.time() < deadline:
        conn.process_data_events(0.1)
    assert len(seen) == 50, len(seen)
    move(via, q, target.name)
    wait_until(lambda: queue_info(via, q)["primary"] == target.name and
               via.api_cluster()["moves"] == [], 20, what="the move")
    conn.process_data_events(0.5)  # anything the move sent again arrives now
    assert len(seen) == 50, ("delivered again before any ack", seen[50:60])
    while True:
        n = len(seen)
        ch.basic_ack(seen[-1][2], multiple=True)
        deadline = time.time() + 5
        while len(seen) == n and time.time() < deadline:
            conn.process_data_events(0.05)
        if len(seen) == n:
            break
    conn.close()
    numbers = [x[0] for x in seen]
    again = sorted(set(x for x in numbers if numbers.count(x) > 1))
    assert not again, ("delivered twice", again[:20], len(again))
    assert [x for x in seen if x[1]] == [], ("flagged redelivered", [x[:2] for x in seen
                                                                       if x[1]][:20])
    eq_numbers = sorted(numbers)
    assert eq_numbers == list(range(300)), (len(numbers), eq_numbers[:10])
    assert numbers == eq_numbers, "out of order"
    assert read_all(via, q) == []


@test(timeout=120)
def a_move_to_the_consumers_broker_keeps_its_deliveries():
    keeps_deliveries("target")


@test(timeout=120)
def a_move_keeps_a_third_brokers_deliveries():
    keeps_deliveries("third")


@test(timeout=180)
def the_old_primary_stays_in_sync_and_can_take_over():
    """A move to the queue's only backup keeps the old primary as its
    backup, in sync at once (its copy is the queue: nothing is caught up).
    Killed, the new primary fails over to it, and every confirmed message
    is there, transient ones too, and the deliveries a consumer held and
    had not acked come again."""
    q = declare_until("mv-s", members["a"],
                      lambda i: (i is not None and i["in_sync"] == i["backups"] and
                                 len(i["backups"]) == 1),
                      **{"x-quay-backups": 1})
    first = queue_info(members["a"], q)
    old, new = members[first["primary"]], members[first["backups"][0]]
    via = others(old.name, new.name)[0]
    conn = connect(via)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish("", q, b"%d-" % i, pika.BasicProperties(delivery_mode=1 + i % 2))
    ch.basic_qos(prefetch_count=20)
    held = []
    for method, _, body in ch.consume(q, inactivity_timeout=10):
        assert method is not None, len(held)
        held.append((method.delivery_tag, int(body.split(b"-", 1)[0])))
        if len(held) == 20:
            break
    catch_ups = metric(new, "quay_replication_catch_ups_total")
    move(via, q, new.name)
    wait_until(lambda: queue_info(via, q)["primary"] == new.name and
               via.api_cluster()["moves"] == [], 20, what="the move")
    info = queue_info(via, q)
    assert info["backups"] == [old.name] and info["in_sync"] == [old.name], info
    for i in range(300, 400):
        ch.basic_publish("", q, b"%d-" % i, pika.BasicProperties(delivery_mode=1 + i % 2))
    for tag, _ in held[:10]:
        ch.basic_ack(tag)
    conn.process_data_events(0.3)
    # Still in sync, and nobody caught the old primary up.
    info = queue_info(via, q)
    assert info["in_sync"] == [old.name], info
    eq_catch_ups = metric(new, "quay_replication_catch_ups_total")
    assert eq_catch_ups == catch_ups, ("the new primary caught its backup up", catch_ups,
                                       eq_catch_ups)
    new.kill()
    wait_until(lambda: (queue_info(via, q) or {}).get("primary") == old.name, 20,
               what="the failover to the old primary", detail=lambda: queue_info(via, q))
    conn.close()  # the ten not acked go back
    got = [int(b.split(b"-", 1)[0]) for b in read_all(via, q)]
    assert len(got) == len(set(got)), sorted(x for x in got if got.count(x) > 1)[:10]
    want = set(range(400)) - set(n for _, n in held[:10])
    assert set(got) == want, (sorted(want - set(got))[:20], sorted(set(got) - want)[:20])
    new.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(new.name) == "up"
                           for m in members.values()), 30, what="%s back" % new.name)


@test(timeout=180)
def moved_back_to_an_emptied_queue_its_backups_hold_what_it_confirms():
    """Found by tests/sim (seed 12; cluster/fence.h, fence_replica_push): a
    queue handed to a backup that adopts nothing (its messages consumed,
    and transient: no log to number from) numbers its seqs from 2^32 + 1,
    at or below those its other backups got from the primary before. They
    took its messages for resends and acked them without keeping them (so
    a failover to one lost what was confirmed). Now they refuse them, leave
    the in-sync set and are caught up: what is confirmed is on both."""
    q = declare_until("mv-e", members["a"],
                      lambda i: (i is not None and len(i["backups"]) == 2 and
                                 i["in_sync"] == i["backups"]),
                      **{"x-quay-backups": 2})
    first = queue_info(members["a"], q)
    p, x = members[first["primary"]], members[first["backups"][0]]

    def moved_to(m):
        move(members["a"], q, m.name)
        wait_until(lambda: (lambda i: i["primary"] == m.name and len(i["in_sync"]) == 2)(
            queue_info(members["a"], q)) and members["a"].api_cluster()["moves"] == [], 20,
            what="the move to %s" % m.name, detail=lambda: queue_info(members["a"], q))

    def publish(first, count):
        conn = connect(members["a"])
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(first, first + count):
            ch.basic_publish("", q, b"%d" % i, pika.BasicProperties(delivery_mode=1))
        conn.close()

    moved_to(x)  # its seqs from 2^32 + 1
    publish(0, 30)
    assert len(read_all(members["a"], q)) == 30
    moved_to(p)  # empty and no log: from 2^32 + 1 again
    publish(100, 20)
    info = queue_info(members["a"], q)
    backups = [members[n] for n in info["backups"]]
    wait_until(lambda: len(queue_info(members["a"], q)["in_sync"]) == 2 and
               all(queue_info(b, q)["replica_messages"] == 20 for b in backups), 20,
               what="both backups holding the 20 confirmed",
               detail=lambda: [(b.name, queue_info(b, q)) for b in backups])
    p.kill()
    survivor = others(p.name)[0]
    wait_until(lambda: (queue_info(survivor, q) or {}).get("primary") not in (None, p.name), 20,
               what="the failover", detail=lambda: queue_info(survivor, q))
    got = sorted(int(b) for b in read_all(survivor, q))
    assert got == list(range(100, 120)), got
    p.start()
    wait_until(lambda: all(m.view() and m.view().brokers.get(p.name) == "up"
                           for m in members.values()), 30, what="%s back" % p.name)
    # (Its factor of three would hold every broker: a drain could not go.)
    conn = connect(survivor)
    conn.channel().queue_delete(q)
    conn.close()


def cluster_info(member):
    return member.api_call("GET", "/api/cluster")[1]


@test(timeout=240)
def a_drained_broker_gives_everything_away_then_leaves():
    """Drain c under load: every queue it is primary or backup of moves to
    a and b (its clients and theirs notice nothing), the factors stay, then
    c leaves the cluster."""
    a, b, c = members["a"], members["b"], members["c"]
    # (Every broker serves the cluster: one may have been restarted just now.)
    wait_until(lambda: all(m.api_call("POST", "/api/cluster/drain", {"broker": "zz"})[0] == 404
                           for m in (a, b, c)), 30, what="every broker serving")
    for bad in (b"", b"{", b'{"broker": 3}', b'{"brokers": "c"}'):
        status, body = a.api_call("POST", "/api/cluster/drain", bad)
        assert status == 400, (bad, status, body)
    conn = connect(a)
    ch = conn.channel()
    names = []
    # A broker back from a restart just now holds fewer queues: placement
    # gives it new ones first, up to its share (CI: all 30 went to a).
    while len(names) < 30 or (len(names) < 90 and
                               not any(queue_info(a, n)["primary"] == "c" for n in names)):
        names.append("dr-%d" % len(names))
        ch.queue_declare(names[-1], durable=True, arguments={"x-quay-backups": 1})
    ch.confirm_delivery()
    for name in names:
        for i in range(50):
            ch.basic_publish("", name, b"%s-%d" % (name.encode(), i),
                             pika.BasicProperties(delivery_mode=2))
    conn.close()
    busy = next(n for n in names if queue_info(a, n)["primary"] == "c")
    held = sum(1 for n in names if queue_info(a, n)["primary"] == "c" or
               "c" in queue_info(a, n)["backups"])
    assert held > 0
    pub = Publisher("a", a, busy, rate=150)
    con = Consumer(b, busy)
    con.start()
    pub.start()
    time.sleep(1.0)
    out = quayctl(a, "--json", "drain", "c")
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert json.loads(out.stdout)["draining"] == "c"

    def holds_nothing():
        info = cluster_info(a)
        bc = next(x for x in info["brokers"] if x["name"] == "c")
        return bc["state"] == "draining" and bc["primaries"] == 0 and bc["backups"] == 0
    wait_until(holds_nothing, 60, what="c drained")
    time.sleep(1.0)
    pub.stopping.set()
    pub.join(30)
    wait_until(lambda: set(con.got) >= set(pub.confirmed), 20, what="everything delivered")
    con.stopping.set()
    con.join(30)
    assert not pub.errors and not con.errors, (pub.errors, con.errors)
    assert not pub.nacked and not con.cancelled
    assert len(con.got) == len(set(con.got)) and in_order(con.got)
    for name in names:
        info = queue_info(a, name)
        assert info["primary"] != "c" and "c" not in info["backups"], info
        assert len(info["backups"]) == 1, info
        if name != busy:
            assert read_all(b, name) == [b"%s-%d" % (name.encode(), i) for i in range(50)]
    # Every broker's log says why: the busy queue's primary went from c for
    # the drain.
    assert map_events(a, busy, "primary_moved", **{"from": "c", "reason": "drain"}), \
        map_events(a, busy)
    # Holding nothing, it may leave.
    out = quayctl(c, "leave")
    assert out.returncode == 0, (out.returncode, out.stderr)
    wait_until(lambda: "c" not in a.view().brokers, 20, what="c gone from the map")


def map_events(member, queue, event=None, **fields):
    """The map-change lines (map_log.h) of queue in member's log, text or
    JSON, as dicts of their key=value fields; those of event with fields."""
    out = []
    for line in member.log_text().splitlines():
        if line.startswith("{"):
            d = json.loads(line)
        else:
            d = dict(w.split("=", 1) for w in line.split(" ")[2:] if "=" in w)
        if "event" in d and "map_epoch" in d and d.get("queue") == queue:
            out.append(d)
    return [d for d in out if (event is None or d["event"] == event) and
            all(d.get(k) == v for k, v in fields.items())]


@test(timeout=240)
def the_logs_say_each_map_change_and_why():
    """Every broker logs each change of a queue's placement with its
    reason, one line per event (map_log.h), in text and in JSON (a fourth
    broker d with --log-format json): a planned move (move_started,
    backup_added, backup_in_sync, primary_moved, reason move) and a kill -9
    failover (primary_moved reason failover), read from a text log and d's;
    and the victim's own state changes with theirs (event=broker_state
    to=down reason=connection_reset or heartbeats_missed, silence_ms; back up:
    heard_again)."""
    a, b = members["a"], members["b"]
    d = cluster.add("d", join=[a], extra_args=["--log-format", "json"])
    members["d"] = d
    # (d's JSON log is not what view() reads: a and b say.)
    wait_until(lambda: all(m.view() and m.view().brokers.get("d") == "up" for m in (a, b)),
               30, what="d up everywhere")
    wait_until(lambda: "caught up with the map" in d.log_text(), 15, what="d caught up")
    # A planned move of a queue to the broker that is not its backup yet
    # (placement decides where it is: d, new and empty, gets many).
    live = {"a": a, "b": b, "d": d}
    q = declare_until("log-mv", a, lambda i: i is not None and len(i["backups"]) == 1,
                      **{"x-quay-backups": 1})
    wait_until(lambda: queue_info(a, q)["in_sync"] == queue_info(a, q)["backups"], 10,
               what="its backup in sync")
    info = queue_info(a, q)
    source = info["primary"]
    target = next(n for n in live if n not in (source, info["backups"][0]))
    fill(a, q, 200)
    move(a, q, target)
    wait_until(lambda: queue_info(a, q)["primary"] == target, 30, what="the move")
    for m in (a, d):  # a logs text, d JSON
        wait_until(lambda: map_events(m, q, "primary_moved"), 10, what="the move in %s's log"
                   % m.name)
        started = map_events(m, q, "move_started", to=target, reason="move")
        assert len(started) == 1, map_events(m, q)
        assert map_events(m, q, "backup_added", broker=target, reason="move"), map_events(m, q)
        assert map_events(m, q, "backup_in_sync", broker=target, reason="sync"), \
            map_events(m, q)
        moved = map_events(m, q, "primary_moved", reason="move", to=target)
        assert [x["from"] for x in moved] == [source], map_events(m, q)
        assert moved[0]["primary"] == target and int(moved[0]["map_epoch"]) > int(
            started[0]["map_epoch"]) and int(moved[0]["queue_epoch"]) > 0, moved
    # A kill -9: a queue whose primary is a or b fails over to its in-sync backup.
    f = declare_until("log-fo", a, lambda i: i is not None and i["primary"] != "d" and
                      len(i["backups"]) == 1, **{"x-quay-backups": 1})
    wait_until(lambda: len(queue_info(a, f)["in_sync"]) == 1, 10, what="its backup in sync")
    info = queue_info(a, f)
    victim, backup = live[info["primary"]], info["in_sync"][0]
    survivor = a if victim is b else b
    victim.kill()
    wait_until(lambda: (queue_info(survivor, f) or {}).get("primary") == backup, 30,
               what="the failover of %s" % f)
    for m in (survivor, d):
        wait_until(lambda: map_events(m, f, "primary_moved", reason="failover"), 10,
                   what="the failover in %s's log" % m.name)
        moved = map_events(m, f, "primary_moved", reason="failover")
        eq_ = [(x["from"], x["to"], x["primary"]) for x in moved]
        assert eq_ == [(victim.name, backup, backup)], map_events(m, f)
    # The JSON lines are objects whose members are the fields.
    line = next(x for x in d.log_text().splitlines()
                if '"event":"primary_moved"' in x and '"queue":"%s"' % f in x)
    assert json.loads(line)["message"] == "cluster map change", line
    assert json.loads(line)["from"] == victim.name, line
    # The broker's own changes say why too: down (its links reset with its
    # heartbeats, or silent too long), and up again when heard.
    def state_lines(m, to):
        out = []
        for line in m.log_text().splitlines():
            d = json.loads(line) if line.startswith("{") else dict(
                w.split("=", 1) for w in line.split(" ")[2:] if "=" in w)
            if d.get("event") == "broker_state" and d.get("broker") == victim.name and \
                    d.get("to") == to:
                out.append((d, line))
        return out
    for m in (survivor, d):
        downs = wait_until(lambda: state_lines(m, "down"), 10, what="%s's down line" % m.name)
        # (The last is the kill's: an earlier test may have stopped the
        # same broker cleanly, which is "stopped".)
        for fields, line in downs[-1:]:
            assert fields["reason"] in ("connection_reset", "heartbeats_missed"), line
            assert int(fields["silence_ms"]) >= 0 and "map_epoch" in fields, line
            assert fields["from"] in ("up", "suspect"), line
    assert any(" -> down; brokers: " in line for _, line in state_lines(survivor, "down"))
    victim.start()
    wait_until(lambda: survivor.view() and survivor.view().brokers.get(victim.name) == "up", 30,
               what="%s back" % victim.name)
    for m in (survivor, d):
        ups = wait_until(lambda: state_lines(m, "up"), 10, what="%s's up line" % m.name)
        assert [f["reason"] for f, _ in ups][-1] == "heard_again", ups


if __name__ == "__main__":
    run(closer(lambda: cluster))
