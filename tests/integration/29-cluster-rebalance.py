"""Goal: the cluster keeps its queues spread. A broker that joins a loaded
cluster takes its share of primaries and backups (and no more than that
moves), while clients on the other brokers publish and consume without
noticing: every confirmed message delivered once, in order, none nacked,
no consumer cancelled, every queue's messages kept. With automatic
rebalancing off (POST /api/cluster/rebalance {"auto": false}), a broker
that comes back after a failover gets nothing back until an operator asks
for one rebalance (quayctl rebalance), which runs until the brokers hold
their shares and then stops. A malformed request is refused.

Method: three quayd processes, then a fourth (tests/cluster/clustertest.py,
--auto-rebalance on, one backup per queue); pika clients in threads
(tests/cluster/loadclients.py); the map read from GET /api/cluster and
/api/queues.
"""
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, closer, connect, declare_until, metric,  # noqa: E402
                         queue_info, quayd_path, read_all, run, test, wait_until)
from loadclients import Consumer, Publisher, in_order  # noqa: E402

import pika  # noqa: E402

QUEUES = ["rb-%d" % i for i in range(48)]
FILL = 40
# The catch-up budget is far above what the tests' small queues need,
# except the one test that fills a queue to see it (a_catch_up_keeps_...).
CATCH_UP_RATE = 4 << 20
ARGS = ["--auto-rebalance", "on", "--default-backups", "1", "--catch-up-rate",
        str(CATCH_UP_RATE)]

cluster = None
members = {}


def quayctl(member, *args):
    ctl = os.path.join(os.path.dirname(quayd_path()), "quayctl")
    return subprocess.run([ctl, "--http", "127.0.0.1:%d" % member.http_port] + list(args),
                          capture_output=True, text=True, timeout=10)


def cluster_info(member):
    return member.api_call("GET", "/api/cluster", timeout=5)[1]


def holdings(member):
    """{broker: (primaries, backups)} and the moves in progress, as member's
    map has them."""
    info = cluster_info(member)
    return {b["name"]: (b["primaries"], b["backups"]) for b in info["brokers"]}, info["moves"]


def placement(member):
    """{queue: primary} of the test's queues."""
    return {q["name"]: q["primary"] for q in member.api_get("/api/queues", timeout=5)
            if q["name"] in QUEUES}


def read_events(ch, queue):
    """The JSON events waiting in queue (basic.get until empty)."""
    out = []
    while True:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is None:
            return out
        out.append(json.loads(body))


def share(total, brokers):
    """The planner's bounds: within 10% of the average."""
    avg = total / brokers
    return math.floor(avg * 0.9), math.ceil(avg * 1.1)


last_seen = {}


def balanced(member, names):
    held, moves = holdings(member)
    last_seen.update(held=held, moves=moves)
    lo, hi = share(len(QUEUES), len(names))
    return not moves and all(lo <= held[n][0] <= hi and lo <= held[n][1] <= hi for n in names)


@test(timeout=120)
def three_brokers_with_queues():
    global cluster
    cluster = Cluster()
    for m in cluster.form(["a", "b", "c"], extra_args=ARGS):
        members[m.name] = m
    a = members["a"]
    wait_until(lambda: cluster_info(a)["rebalance"] == "auto", 10, what="rebalance auto")
    conn = connect(a)
    ch = conn.channel()
    ch.confirm_delivery()
    for name in QUEUES:
        ch.queue_declare(name, durable=True)
        for i in range(FILL):
            ch.basic_publish("", name, b"%s-%d" % (name.encode(), i),
                             pika.BasicProperties(delivery_mode=2))
    conn.close()
    wait_until(lambda: balanced(a, ["a", "b", "c"]), 30, what="the queues spread over a, b, c")


@test(timeout=60)
def malformed_requests_are_refused():
    a = members["a"]
    for bad in (b"{", b"[]", b'{"auto": 1}', b'{"auto": "on"}', b'{"mode": true}'):
        status, body = a.api_call("POST", "/api/cluster/rebalance", bad, timeout=5)
        assert status == 400 and body.get("error"), (bad, status, body)
    out = quayctl(a, "rebalance", "sometimes")
    assert out.returncode == 64, (out.returncode, out.stderr)
    assert cluster_info(a)["rebalance"] == "auto"
    # quayctl cluster: the pairs, then the brokers as a table.
    out = quayctl(a, "cluster")
    assert out.returncode == 0, out.stderr
    text = out.stdout.split("\nbrokers:\n", 1)
    assert len(text) == 2 and "rebalance                auto" in text[0], out.stdout
    rows = text[1].split("\n\n", 1)[0].splitlines()
    assert rows[0].split()[:2] == ["ID", "NAME"], rows
    assert sorted(r.split()[1] for r in rows[1:]) == ["a", "b", "c"], rows


@test(timeout=180)
def a_joining_broker_takes_its_share_under_load():
    a, b, c = members["a"], members["b"], members["c"]
    before = placement(a)
    busy = QUEUES[:3]
    pubs = [Publisher(m.name, m, q, rate=100) for m, q in zip((a, b, c), busy)]
    cons = [Consumer(m, q, ack_delay=0.05) for m, q in zip((b, c, a), busy)]
    for t in cons + pubs:
        t.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    members["d"] = cluster.add("d", join=[a], extra_args=ARGS)
    wait_until(lambda: balanced(a, ["a", "b", "c", "d"]), 60,
               what="d holding its share", detail=lambda: last_seen)
    took = time.monotonic() - t0
    time.sleep(0.5)
    for p in pubs:
        p.stopping.set()
        p.join(30)
    for p, con in zip(pubs, cons):
        wait_until(lambda: set(con.got) >= set(p.confirmed), 20, what="everything delivered")
        con.stopping.set()
        con.join(30)
        assert not p.errors and not con.errors, (p.errors, con.errors)
        assert p.confirmed and not p.nacked and not con.cancelled, (len(p.confirmed), p.nacked)
        assert len(con.got) == len(set(con.got)) and in_order(con.got)
    after = placement(a)
    moved = sum(1 for q in QUEUES if after[q] != before[q])
    _, hi = share(len(QUEUES), 4)
    print("# d took %d primaries in %.1f s (moved %d)" % (holdings(a)[0]["d"][0], took, moved))
    assert moved <= hi, (moved, hi, before, after)
    for name in QUEUES[3:]:
        assert read_all(b, name) == [b"%s-%d" % (name.encode(), i) for i in range(FILL)], name
    # (read_all emptied them: the next test fills them again.)


@test(timeout=240)
def with_auto_off_a_returning_broker_waits_for_an_asked_rebalance():
    a, d = members["a"], members["d"]
    status, body = a.api_call("POST", "/api/cluster/rebalance", {"auto": False}, timeout=5)
    assert status == 202 and body["rebalance"] == "off", (status, body)
    wait_until(lambda: all(cluster_info(m)["rebalance"] == "off" for m in members.values()),
               10, what="rebalance off everywhere")
    d.kill()
    wait_until(lambda: holdings(a)[0]["d"][0] == 0, 20, what="d's queues failed over")
    d.start()
    names = ["a", "b", "c", "d"]
    wait_until(lambda: all(m.view() and m.view().brokers.get("d") == "up"
                           for m in members.values()), 30, what="d back")
    time.sleep(4.0)  # beyond CONTROLLER_REBALANCE_SETTLE_MS: an automatic one would have begun
    assert holdings(a)[0]["d"][0] == 0, holdings(a)
    out = quayctl(a, "--json", "rebalance")
    assert out.returncode == 0, (out.returncode, out.stderr)
    answer = json.loads(out.stdout)
    assert answer["rebalance"] == "once" and answer["primary_moves"] > 0, answer
    wait_until(lambda: balanced(a, names), 60, what="balanced again", detail=lambda: last_seen)
    wait_until(lambda: cluster_info(a)["rebalance"] == "off", 10, what="the rebalance ended")
    out = quayctl(a, "--json", "rebalance", "on")
    assert out.returncode == 0 and json.loads(out.stdout)["rebalance"] == "auto", out.stdout
    wait_until(lambda: cluster_info(d)["rebalance"] == "auto", 10, what="rebalance auto again")



@test(timeout=180)
def a_revived_drain_gets_its_share_back():
    """Drain d, then revive it (quayctl revive): automatic rebalancing gives
    it its share again; reviving a broker that is not draining is refused."""
    a, d = members["a"], members["d"]
    status, body = a.api_call("POST", "/api/cluster/revive", {"broker": "d"}, timeout=5)
    assert status == 409 and "not draining" in body["reason"], (status, body)
    for bad in (b"", b"{", b'{"broker": 4}'):
        status, body = a.api_call("POST", "/api/cluster/revive", bad, timeout=5)
        assert status == 400, (bad, status, body)
    status, body = a.api_call("POST", "/api/cluster/revive", {"broker": "zz"}, timeout=5)
    assert status == 404, (status, body)
    out = quayctl(a, "drain", "d")
    assert out.returncode == 0, (out.returncode, out.stderr)
    wait_until(lambda: holdings(a)[0]["d"] == (0, 0), 60, what="d drained",
               detail=lambda: holdings(a))
    out = quayctl(a, "--json", "revive", "d")
    assert out.returncode == 0 and json.loads(out.stdout)["revived"] == "d", out
    wait_until(lambda: balanced(a, ["a", "b", "c", "d"]), 60, what="d's share back",
               detail=lambda: last_seen)



@test(timeout=180)
def an_offload_moves_a_fraction_or_the_named_queues():
    """With automatic rebalancing off (else it could move them back): half
    of a's primaries go to b (quayctl offload a --to b --fraction 0.5), then
    the queues named by a pattern that c is primary of go to d; each keeps
    its messages. Malformed or impossible requests are refused."""
    a = members["a"]
    assert a.api_call("POST", "/api/cluster/rebalance", {"auto": False}, timeout=5)[0] == 202
    wait_until(lambda: cluster_info(a)["rebalance"] == "off", 10, what="rebalance off")
    conn = connect(a)
    ch = conn.channel()
    ch.confirm_delivery()
    for name in QUEUES:
        ch.queue_purge(name)
        ch.basic_publish("", name, name.encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    cases = [({"broker": "a", "to": "a", "percent": 50}, 409),
             ({"broker": "zz", "to": "b", "percent": 50}, 404),
             ({"broker": "a", "to": "zz", "percent": 50}, 404),
             ({"broker": "a", "to": "b"}, 400),
             ({"broker": "a", "to": "b", "percent": 50, "queues": "x"}, 400),
             ({"broker": "a", "to": "b", "percent": 0}, 400),
             ({"broker": "a", "to": "b", "percent": 101}, 400),
             ({"broker": "a", "to": "b", "queues": "("}, 400),
             ({"broker": "a", "to": "b", "percent": 50, "x": 1}, 400)]
    for body, want in cases:
        status, answer = a.api_call("POST", "/api/cluster/offload", body, timeout=5)
        assert status == want and answer.get("reason"), (body, status, answer)
    out = quayctl(a, "offload", "a", "--to", "b")
    assert out.returncode == 64, (out.returncode, out.stderr)
    before = placement(a)
    on_a = sorted(q for q in QUEUES if before[q] == "a")
    watch = connect(members["c"])  # (a queue on a would count among its primaries)
    wch = watch.channel()
    events = wch.queue_declare("", exclusive=True).method.queue
    wch.queue_bind(events, "amq.quay.cluster", "queue.moved.#")
    out = quayctl(a, "--json", "offload", "a", "--to", "b", "--fraction", "0.5")
    assert out.returncode == 0, (out.returncode, out.stderr)
    answer = json.loads(out.stdout)
    assert answer["moves"] == (len(on_a) + 1) // 2 and answer["skipped"] == 0, (answer, on_a)
    wait_until(lambda: not holdings(a)[1] and
               sum(1 for q in on_a if placement(a)[q] == "b") == answer["moves"], 30,
               what="half of a's queues on b", detail=lambda: holdings(a))
    after = placement(a)
    assert all(after[q] == before[q] for q in QUEUES if q not in on_a), (before, after)
    # Each handover is published on amq.quay.cluster, as planned.
    moved = []
    wait_until(lambda: moved.extend(read_events(wch, events)) or len(moved) >= answer["moves"],
               10, what="the moves published", detail=lambda: moved)
    assert sorted(e["queue"] for e in moved) == sorted(q for q in on_a if after[q] == "b"), moved
    assert all(e["planned"] and e["primary"] == "b" for e in moved), moved
    watch.close()
    # A pattern naming three of c's queues (placement decides which it has)
    # and one queue of another broker, which stays where it is.
    on_c = sorted(q for q in QUEUES if after[q] == "c")[:3]
    elsewhere = next(q for q in QUEUES if after[q] not in ("c", "d"))
    assert on_c, after
    pattern = "^(%s)$" % "|".join(on_c + [elsewhere])
    out = quayctl(a, "--json", "offload", "c", "--to", "d", "--queues", pattern,
                  "--vhost", "/")
    assert out.returncode == 0 and json.loads(out.stdout)["moves"] == len(on_c), out
    wait_until(lambda: not holdings(a)[1] and all(placement(a)[q] == "d" for q in on_c), 30,
               what="c's named queues on d", detail=lambda: holdings(a))
    assert placement(a)[elsewhere] == after[elsewhere], "moved a queue c is not primary of"
    print("# offloaded %d of a's %d queues to b, %d of c's to d" % (
        answer["moves"], len(on_a), len(on_c)))
    for name in QUEUES:
        assert read_all(members["b"], name) == [name.encode()], name



@test(timeout=120)
def a_catch_up_keeps_to_its_byte_budget():
    """--catch-up-rate 4 MiB/s: moving a queue of 12 MiB to a broker that
    does not hold it takes about 3 s of catching up, not a fraction of one
    (what it takes unbounded), and loses nothing."""
    a = members["a"]
    name = "rb-budget"
    conn = connect(a)
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    body = b"x" * 4096
    for i in range(3072):
        ch.basic_publish("", name, b"%05d" % i + body, pika.BasicProperties(delivery_mode=2))
    conn.close()
    info = next(q for q in a.api_get("/api/queues", timeout=5) if q["name"] == name)
    wait_until(lambda: next(q for q in a.api_get("/api/queues", timeout=5)
                            if q["name"] == name)["in_sync"] == info["backups"], 20,
               what="its backup in sync")
    target = next(n for n in members if n != info["primary"] and n not in info["backups"])
    t0 = time.monotonic()
    status, body = a.api_call("POST", "/api/cluster/move", {"queue": name, "to": target},
                              timeout=5)
    assert status == 202, (status, body)
    # Its primary's broker shows the catch-up going on.
    seen = []

    def progress():
        moves = members[info["primary"]].api_cluster()["moves"]
        seen.extend(m["caught_up_bytes"] for m in moves if "caught_up_bytes" in m)
        return seen and seen[-1] > 0
    wait_until(progress, 10, what="the catch-up's progress shown")
    wait_until(lambda: next(q for q in a.api_get("/api/queues", timeout=5)
                            if q["name"] == name)["primary"] == target, 60,
               what="the move done")
    took = time.monotonic() - t0
    size = 3072 * (4096 + 5)
    print("# %d bytes caught up in %.1f s (budget %d bytes/s)" % (size, took, CATCH_UP_RATE))
    assert size / CATCH_UP_RATE * 0.7 <= took <= size / CATCH_UP_RATE * 3, took
    assert seen == sorted(seen) and seen[-1] <= size + 3072 * 64, seen
    got = read_all(members[target], name)
    assert got == [b"%05d" % i + b"x" * 4096 for i in range(3072)], len(got)


@test(timeout=240)
def a_catch_up_sends_what_its_primary_paged_out_meanwhile():
    """A catch-up borrows the queue's messages as it begins (it neither
    copies nor references them: bench/RESULTS.md); the primary, pressed for
    memory meanwhile (--memory-high-watermark: past half of it, durable
    queues keep their persistent messages on disk only), pages out those
    still to send. They are read back from its log when their turn comes:
    the queue, moved to the broker caught up, serves every message once,
    in order. (Sent after their memory went, they would be garbage, or a
    use after free under ASan.) The queue is deep enough (16,384 messages)
    for the catch-up to ready its backlog's room over several turns
    before it begins (replication.c room_ready)."""
    own = Cluster()
    try:
        a, b, c = own.form(["pa", "pb", "pc"], extra_args=[
            "--auto-rebalance", "off", "--default-backups", "1",
            "--catch-up-rate", str(2 << 20), "--memory-high-watermark", "160MiB"])
        byname = {m.name: m for m in (a, b, c)}
        name = "pg"
        conn = connect(a)
        ch = conn.channel()
        ch.queue_declare(name, durable=True)
        conn.close()
        info = queue_info(a, name)
        primary = byname[info["primary"]]
        target = next(m for m in (a, b, c)
                      if m.name != info["primary"] and m.name not in info["backups"])
        bodies = [b"%05d " % i + b"p" * 1024 for i in range(16384)]  # 16 MiB
        conn = connect(primary)
        ch = conn.channel()
        for body in bodies:
            ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
        conn.close()
        wait_until(lambda: queue_info(primary, name)["messages"] == len(bodies), 30,
                   what="every message in the queue")
        wait_until(lambda: queue_info(a, name)["in_sync"] == info["backups"], 30,
                   what="its backup in sync")
        assert queue_info(primary, name)["paged"] == 0
        status, body = a.api_call("POST", "/api/cluster/move",
                                  {"queue": name, "to": target.name}, timeout=5)
        assert status == 202, (status, body)
        wait_until(lambda: any(m.get("caught_up_bytes", 0) > 0
                               for m in primary.api_cluster()["moves"]), 10,
                   what="the catch-up begun")
        # Transient messages (never paged) on the same broker push it past
        # the paging limit: the queue's messages go to disk.
        filler = declare_until("pg-fill", primary, lambda q: q["primary"] == primary.name,
                               durable=False, **{"x-quay-backups": 0})
        conn = connect(primary)
        ch = conn.channel()
        for _ in range(40):
            ch.basic_publish("", filler, b"f" * (2 << 20))
        conn.close()
        wait_until(lambda: queue_info(primary, name)["paged"] > 0, 10,
                   what="the queue paged out")
        moves = primary.api_cluster()["moves"]
        left = [m for m in moves if m.get("phase") == "catching-up"]
        assert left and left[0]["caught_up_bytes"] < len(bodies) * 1024, moves
        print("# paged out with %d of %d bytes caught up; estimate %d bytes" % (
            left[0]["caught_up_bytes"], len(bodies) * 1030,
            metric(primary, "quay_memory_estimate_bytes")))
        conn = connect(primary)
        conn.channel().queue_delete(filler)
        conn.close()
        wait_until(lambda: queue_info(a, name)["primary"] == target.name, 60,
                   what="the move done")
        got = read_all(target, name)
        assert got == bodies, (len(got), [m[:6] for m in got[:2]])
    finally:
        for problem in own.close():
            raise AssertionError(problem)


if __name__ == "__main__":
    run(closer(lambda: cluster))
