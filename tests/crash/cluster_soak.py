"""cluster_soak.py -- a fault soak of a quay cluster: no confirmed message lost,
no split brain, the replication factor restored after every repair.

Brokers: BROKERS (3-5) quayd processes, each a host in its own network
namespace (tests/cluster/netlab.py); the test process reaches every host
through the lab's bridge, the faults are between hosts. Queues: QUEUES
durable queues, x-quay-backups from BACKUPS (a list, cycled: "2" or "1,2");
odd-numbered queues get persistent messages, even ones transient (with
NON_DURABLE=1 the even queues are not durable either: only their backups
keep them through a broker's death, or a primary's fast restart). Each queue
has a confirming publisher (window WINDOW, PUB_RATE msg/s) and an acking
consumer, spread over the brokers; a client whose connection dies, or whose
oldest unconfirmed publish waited CONFIRM_TIMEOUT s, or (a consumer) that got
nothing for CONSUMER_IDLE s while its queue has confirmed messages it has not
received, reconnects to the next broker. A publisher resends everything that
was not confirmed (and every nacked message): at-least-once.

Faults: every FAULT_EVERY seconds one random action among those allowed:

  kill       kill -9 of a broker; primary-biased: with probability 3/4 the
             primary (per /api/queues) of a random queue
  restart    restart of a killed broker
  cut        one broker (primary-biased too) silently cut from all the
             other brokers (nftables drops; no resets)
  partition  the brokers split into a majority and a minority (the minority
             holds the Raft leader when it can)
  heal       the cut or the partition removed
  move       a random queue moved (POST /api/cluster/move, through a random
             broker) to a random broker that is up and reachable: a planned
             handover while the faults go on; not an impairment
  drain      a random broker that is up drained (POST /api/cluster/drain):
             its queues move off it while the faults go on; not an
             impairment
  revive     the draining broker revived (POST /api/cluster/revive) no
             sooner than FAULT_DOWN s later: the rebalance gives it queues
             again

The brokers run with --auto-rebalance on: after a restart or a heal the
controller moves queues back to spread them (handovers again).

At most (BROKERS-1)/2 brokers are impaired (killed, cut off, or in the
minority) at once, so a majority always works. A kind not seen yet is
preferred, so even a short run has every kind. A repair may come no sooner
than FAULT_DOWN s after its fault. After each repair that leaves the cluster
whole, the soak waits until every queue is back at its replication factor.

Checks (all asserted; any failure -> exit 1, logs kept):

  confirmed   distinct messages whose publish was confirmed
  received    distinct messages the consumers got
  duplicates  deliveries of a message already received, by cause:
                resent       another publish of it (the publisher resent an
                             unconfirmed or nacked message)
                redelivered  the same publish again, flagged redelivered
                unflagged    the same publish again, NOT flagged (a broker
                             resent it internally, e.g. a proxy's forward)
  nacked      publishes nacked by the broker (resent)
  lost        confirmed messages never received: must be 0
  split-brain from every broker's /api/queues, polled every POLL_MS ms:
              "confirms": {"epoch", "first_ms", "last_ms", "count"} per queue.
              No epoch may have confirms from two brokers, and for epochs
              E1 < E2 of a queue, E1's last_ms < E2's first_ms (the worst
              margin is printed). Skipped, with a "not available" line, when
              the brokers do not report "confirms".
  restore     after each repair that leaves every broker up and connected:
              within RESTORE_TIMEOUT s every broker's /api/queues shows each
              queue available, with its full backup count, all in sync, and
              the same placement everywhere (the time is printed)

Usage: /usr/bin/python3 tests/crash/cluster_soak.py [SECONDS] [options]  (default 120 s)
       /usr/bin/python3 tests/crash/cluster_soak.py --selftest   (the checker on made-up data)
Environment (each also an option, --brokers etc.; see --help):
  QUAYD=build/quayd BROKERS=3 QUEUES=4 BACKUPS=2 SEED=random FAULT_EVERY=20
  FAULT_DOWN=0 FAULTS=kill,cut,partition,move,drain RESTORE_TIMEOUT=15 PUB_RATE=200 NON_DURABLE=0
  WINDOW=50 CONFIRM_TIMEOUT=5 CONSUMER_IDLE=10 POLL_MS=200 NETNS=1
NETNS=0 runs the brokers on loopback (no root needed) with kill/restart only.
Needs root for the namespaces (exit 77, "skipped", without it when
SKIP_WITHOUT_ROOT=1, as CTest sets it).
"""
import argparse
import collections
import json
import os
import random
import shlex
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
from clustertest import Cluster, wait_until  # noqa: E402

USER, PASSWORD = "soak", "soak-pass"


def env(name, default):
    return os.environ.get(name, default)


def parse_args(argv):
    p = argparse.ArgumentParser(description="quay cluster fault soak (see the module docstring)")
    p.add_argument("seconds", nargs="?", type=float, default=120.0)
    p.add_argument("--brokers", type=int, default=int(env("BROKERS", "3")))
    p.add_argument("--queues", type=int, default=int(env("QUEUES", "4")))
    p.add_argument("--backups", default=env("BACKUPS", "2"),
                   help="x-quay-backups per queue, a comma list cycled over the queues")
    p.add_argument("--seed", type=int, default=int(env("SEED", "0")) or None)
    p.add_argument("--fault-every", type=float, default=float(env("FAULT_EVERY", "20")))
    p.add_argument("--fault-down", type=float, default=float(env("FAULT_DOWN", "0")))
    p.add_argument("--faults", default=env("FAULTS", "kill,cut,partition,move,drain"))
    p.add_argument("--restore-timeout", type=float, default=float(env("RESTORE_TIMEOUT", "15")))
    p.add_argument("--pub-rate", type=float, default=float(env("PUB_RATE", "200")),
                   help="msg/s per publisher (0 = unlimited)")
    p.add_argument("--publishers", type=int, default=int(env("PUBLISHERS", "2")),
                   help="publishers per queue, started on different brokers")
    p.add_argument("--client-split", default=env("CLIENT_SPLIT", "fail"), choices=["fail", "warn"],
                   help="what a split brain seen by the clients does")
    p.add_argument("--window", type=int, default=int(env("WINDOW", "50")))
    p.add_argument("--confirm-timeout", type=float, default=float(env("CONFIRM_TIMEOUT", "5")))
    p.add_argument("--consumer-idle", type=float, default=float(env("CONSUMER_IDLE", "10")))
    p.add_argument("--poll-ms", type=float, default=float(env("POLL_MS", "200")))
    p.add_argument("--netns", type=int, default=int(env("NETNS", "1")))
    p.add_argument("--quayd-args", default=env("QUAYD_ARGS", ""),
                   help="more quayd options for every broker, e.g. "
                        "'--partition-handling pause-minority'")
    p.add_argument("--trace-dups", type=int, default=int(env("TRACE_DUPS", "0")),
                   help="print this many unflagged duplicates in detail (who published "
                        "each, when, and every delivery of it) and keep the brokers' logs")
    p.add_argument("--non-durable", type=int, default=int(env("NON_DURABLE", "0")),
                   help="1: the transient (even) queues are declared non-durable")
    p.add_argument("--selftest", action="store_true", help="test the checker and exit")
    a = p.parse_args(argv)
    if not 3 <= a.brokers <= 5:
        p.error("--brokers must be 3..5")
    a.backups = [int(x) for x in a.backups.split(",")]
    a.faults = set(x for x in a.faults.split(",") if x)
    if not a.netns:
        a.faults &= {"kill", "move", "drain"}
    return a


# ---------------------------------------------------------------------------
# The split-brain checker (pure: records in, findings out)
# ---------------------------------------------------------------------------

def check_split_brain(records):
    """records: {(broker, incarnation, queue, epoch): {"first_ms", "last_ms", "count"}}.
    Returns (violations, stats): violations is a list of strings; stats has
    "epochs" (with confirms), "pairs" (E1 < E2 pairs compared) and
    "worst_margin_ms" (min over pairs of first_ms(E2) - last_ms(E1), None
    without pairs) and "worst" (where)."""
    # Merge incarnations: one interval per (queue, epoch, broker).
    per = collections.defaultdict(dict)
    for (broker, _inc, queue, epoch), r in records.items():
        if not r.get("count"):
            continue
        d = per[(queue, epoch)]
        f, l_ = r["first_ms"], r["last_ms"]
        if broker in d:
            f0, l0, n0 = d[broker]
            d[broker] = (min(f0, f), max(l0, l_), n0 + r["count"])
        else:
            d[broker] = (f, l_, r["count"])
    violations = []
    by_queue = collections.defaultdict(list)
    for (queue, epoch), d in sorted(per.items()):
        if len(d) > 1:
            violations.append("queue %s epoch %d: confirms from %d brokers: %s" % (
                queue, epoch, len(d), ", ".join("%s %d..%d (%d)" % (b, f, l_, n)
                                               for b, (f, l_, n) in sorted(d.items()))))
        first = min(f for f, _, _ in d.values())
        last = max(l_ for _, l_, _ in d.values())
        by_queue[queue].append((epoch, first, last, "+".join(sorted(d))))
    worst, where, pairs = None, None, 0
    for queue, eps in sorted(by_queue.items()):
        eps.sort()
        for i in range(len(eps)):
            for j in range(i + 1, len(eps)):
                e1, _, last1, b1 = eps[i]
                e2, first2, _, b2 = eps[j]
                pairs += 1
                margin = first2 - last1
                if worst is None or margin < worst:
                    worst, where = margin, "queue %s: epoch %d (%s) last %d, epoch %d (%s) first %d" % (
                        queue, e1, b1, last1, e2, b2, first2)
                if margin <= 0:
                    violations.append("queue %s: epoch %d (%s) confirmed until %d ms, epoch %d (%s) "
                                      "from %d ms: overlap %d ms" % (queue, e1, b1, last1, e2, b2,
                                                                    first2, -margin))
    return violations, {"epochs": len(per), "pairs": pairs, "worst_margin_ms": worst,
                        "worst": where}


GRACE = 0.25   # confirms within this long after a cut may be in flight from before it


def check_client_split(faults, acks):
    """Split brain as the publishers saw it: during a cut or partition
    (from GRACE s after it began until the heal), confirms for one queue came
    from brokers on both sides, and the minority side confirmed after the
    majority side had started (two primaries confirming at once). faults:
    [{"start", "end", "minority", "majority"}]; acks: {queue: [(t, broker)]}.
    Returns (violations, stats); margin = majority's first - minority's last."""
    violations, worst, where, both, minority_acks = [], None, None, 0, 0
    for i, f in enumerate(faults):
        s, e = f["start"] + GRACE, f["end"] if f["end"] is not None else float("inf")
        for qn, lst in sorted(acks.items()):
            a = [t for t, b in lst if s < t <= e and b in f["minority"]]
            b_ = [t for t, b in lst if s < t <= e and b in f["majority"]]
            minority_acks += len(a)
            if not a or not b_:
                continue
            both += 1
            margin = (min(b_) - max(a)) * 1000
            what = "%s #%d (%s | %s), queue %s: minority confirmed until +%.2f s, majority from " \
                "+%.2f s" % (f["kind"], i + 1, "".join(sorted(f["majority"])),
                             "".join(sorted(f["minority"])), qn, max(a) - f["start"],
                             min(b_) - f["start"])
            if worst is None or margin < worst:
                worst, where = margin, what
            if margin <= 0:
                violations.append(what + " (%d confirms on the minority side)" % len(a))
    return violations, {"both": both, "worst_margin_ms": None if worst is None else int(worst),
                        "worst": where, "minority_acks": minority_acks}


def selftest():
    ok = {("a", 1, "q", 5): {"first_ms": 1000, "last_ms": 2000, "count": 10},
          ("b", 1, "q", 7): {"first_ms": 2600, "last_ms": 4000, "count": 10},
          ("b", 1, "q", 6): {"first_ms": 0, "last_ms": 0, "count": 0},      # no confirms
          ("a", 1, "r", 3): {"first_ms": 100, "last_ms": 200, "count": 1},
          ("a", 2, "r", 3): {"first_ms": 300, "last_ms": 400, "count": 1}}  # same broker, restarted
    v, s = check_split_brain(ok)
    assert v == [] and s["worst_margin_ms"] == 600 and s["pairs"] == 1, (v, s)
    two = dict(ok)
    two[("c", 1, "q", 7)] = {"first_ms": 3000, "last_ms": 3100, "count": 2}
    v, _ = check_split_brain(two)
    assert len(v) == 1 and "epoch 7: confirms from 2 brokers" in v[0], v
    overlap = dict(ok)
    overlap[("a", 1, "q", 5)] = {"first_ms": 1000, "last_ms": 2600, "count": 10}
    v, s = check_split_brain(overlap)
    assert len(v) == 1 and "overlap 0 ms" in v[0] and s["worst_margin_ms"] == 0, (v, s)
    later = dict(ok)
    later[("c", 1, "q", 9)] = {"first_ms": 3500, "last_ms": 3600, "count": 1}
    v, s = check_split_brain(later)
    assert len(v) == 1 and "overlap 500 ms" in v[0] and s["worst_margin_ms"] == -500, (v, s)
    f = [{"kind": "cut", "start": 10.0, "end": 20.0, "minority": {"a"}, "majority": {"b", "c"}}]
    v, st = check_client_split(f, {"q": [(10.1, "a"), (12.0, "a"), (13.0, "b"), (21.0, "a")]})
    assert v == [] and st["worst_margin_ms"] == 1000, (v, st)
    v, st = check_client_split(f, {"q": [(12.0, "a"), (13.0, "b"), (14.0, "a")]})
    assert len(v) == 1 and st["worst_margin_ms"] == -1000, (v, st)
    print("selftest ok")


# ---------------------------------------------------------------------------
# The soak
# ---------------------------------------------------------------------------

class QueueState:
    def __init__(self, index, name, backups, persistent):
        self.index = index
        self.name = name
        self.backups = backups
        self.persistent = persistent
        self.next_id = 0
        self.sends = {}             # id -> attempts so far
        self.confirmed = set()
        self.received = {}          # id -> set of attempts seen
        self.dup = collections.Counter()
        self.acks = []              # (monotonic time, broker) of each positive confirm
        # --trace-dups: (id, attempt) -> (soak time, broker) of its publish,
        # and -> [(soak time, broker, redelivered)] of its deliveries
        self.sent_at = {}
        self.deliveries = collections.defaultdict(list)
        self.unflagged = []         # (id, attempt) of each unflagged duplicate
        self.nacked = 0
        self.last_delivery = time.monotonic()


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.stop_publish = threading.Event()
        self.stop_all = threading.Event()
        self.t0 = time.monotonic()
        self.stats = collections.Counter()
        self.failures = []
        self.restores = []          # (what, seconds)
        self.records = {}           # (broker, inc, queue, epoch) -> confirms record
        self.confirms_seen = False
        self.serving_overlaps = 0
        self.serving_now = {}       # (broker, queue) -> bool
        self.killed = set()
        self.died = set()           # exited without our kill
        self.net = None             # None | ("cut", [victim], rest) | ("partition", major, minor)
        self.fault_since = {}
        self.net_faults = []        # {"kind", "start", "end", "minority", "majority"}
        self.kinds_done = collections.Counter()
        self.draining = None        # the broker a drain was asked of, until revived
        self.incarnation = {}
        self.publisher_on = {}      # queue name -> broker its publisher is connected to
        self.lab = None
        self.cluster = None
        self.members = []
        self.queues = []

    # -- output --------------------------------------------------------------
    def now(self):
        return time.monotonic() - self.t0

    def log(self, text):
        print("# %6.1f s: %s" % (self.now(), text), flush=True)

    def fail(self, text):
        self.failures.append(text)
        self.log("FAIL " + text)

    def counts(self):
        with self.lock:
            c = sum(len(q.confirmed) for q in self.queues)
            r = sum(len(q.received) for q in self.queues)
            d = sum(sum(q.dup.values()) for q in self.queues)
        return "confirmed %d, received %d, duplicates %d" % (c, r, d)

    # -- brokers -------------------------------------------------------------
    def setup(self):
        a = self.a
        self.cluster = Cluster()
        users = self.cluster.users_file(USER, PASSWORD)
        common = dict(extra_args=["--users", users, "--auto-rebalance", "on"] +
                      shlex.split(self.a.quayd_args))
        if a.netns:
            from netlab import Lab
            self.lab = Lab(a.brokers)
        names = "abcde"[:a.brokers]
        for i, name in enumerate(names):
            kw = dict(common)
            if self.lab:
                kw.update(host=self.lab.ip(i + 1), netns=self.lab.ns(i + 1))
            if i:
                kw["join"] = self.members[:]
            m = self.cluster.add(name, **kw)
            m.index = i + 1
            self.incarnation[name] = 1
            self.members.append(m)
            if i == 0:
                wait_until(lambda: len(self.cluster.leaders([m])) == 1, 30, what="a to lead")
        expect = {m.name: "up" for m in self.members}
        wait_until(lambda: all(m.view() and m.view().brokers == expect for m in self.members),
                   60, what="every broker up everywhere")
        if not self.cluster.has_http:
            raise AssertionError("quayd has no --http: the soak needs /api/queues")
        c = self.connect(self.members[0])
        ch = c.channel()
        for i in range(a.queues):
            b = a.backups[i % len(a.backups)]
            name = "soak-%d" % i
            durable = bool(i % 2) or not a.non_durable
            ch.queue_declare(name, durable=durable, arguments={"x-quay-backups": b})
            self.queues.append(QueueState(i, name, b, persistent=bool(i % 2)))
        c.close()
        self.log("%d brokers (%s), %d queues (backups %s), seed %d, dir %s" % (
            a.brokers, "netns hosts" if self.lab else "loopback", a.queues,
            ",".join(str(q.backups) for q in self.queues), a.seed, self.cluster.dir))
        self.wait_restored("the start")

    def connect(self, member):
        import pika
        return pika.BlockingConnection(pika.ConnectionParameters(
            member.host, member.amqp_port, "/", pika.PlainCredentials(USER, PASSWORD),
            heartbeat=10, socket_timeout=3, blocked_connection_timeout=30,
            connection_attempts=1))

    def api_queues(self, member, timeout=2.0):
        # As the soak's user (Cluster.users_file made it an administrator).
        return member.api_get("/api/queues", timeout=timeout)

    def reachable(self, member):
        return member.alive()

    # -- /api/queues poller --------------------------------------------------
    def poller(self, member):
        period = self.a.poll_ms / 1000.0
        while not self.stop_all.is_set():
            t = time.monotonic()
            inc = self.incarnation[member.name]
            if member.alive():
                try:
                    qs = self.api_queues(member, timeout=1.0)
                except Exception:
                    qs = None
                if qs is not None and inc == self.incarnation[member.name]:
                    self.take_sample(member.name, inc, qs)
            time.sleep(max(0.0, period - (time.monotonic() - t)))

    def take_sample(self, broker, inc, qs):
        with self.lock:
            for q in qs:
                name = q.get("name")
                cf = q.get("confirms")
                if isinstance(cf, dict) and "epoch" in cf:
                    self.confirms_seen = True
                    self.records[(broker, inc, name, int(cf["epoch"]))] = {
                        "first_ms": int(cf.get("first_ms") or 0),
                        "last_ms": int(cf.get("last_ms") or 0),
                        "count": int(cf.get("count") or 0)}
                if "serving" in q:
                    self.serving_now[(broker, name)] = bool(q["serving"])
                    if q["serving"]:
                        others = [b for (b, n), s in self.serving_now.items()
                                  if n == name and s and b != broker]
                        if others:
                            self.serving_overlaps += 1

    # -- clients -------------------------------------------------------------
    def publisher(self, q, start):
        import pika
        a = self.a
        k = start
        resend = collections.deque()     # ids to publish again
        period = 1.0 / a.pub_rate if a.pub_rate > 0 else 0.0
        props = pika.BasicProperties(delivery_mode=2 if q.persistent else 1)
        while not self.stop_all.is_set():
            if self.stop_publish.is_set() and not resend:
                return
            member = self.members[k % len(self.members)]
            k += 1
            if not member.alive():
                time.sleep(0.05)
                continue
            conn = None
            outstanding = collections.OrderedDict()   # tag -> (id, sent_at)
            state = {"tag": 0, "selected": False}

            def on_confirm(frame):
                m = frame.method
                tags = [t for t in outstanding if t <= m.delivery_tag] if m.multiple \
                    else [m.delivery_tag]
                nack = isinstance(m, pika.spec.Basic.Nack)
                with self.lock:
                    for t in tags:
                        ent = outstanding.pop(t, None)
                        if ent is None:
                            continue
                        if nack:
                            q.nacked += 1
                            resend.append(ent[0])
                        else:
                            q.confirmed.add(ent[0])
                    if not nack and tags:
                        q.acks.append((time.monotonic(), member.name))
            try:
                conn = self.connect(member)
                self.publisher_on[(q.name, start)] = member.name
                ch = conn.channel()
                ch._impl.confirm_delivery(ack_nack_callback=on_confirm,
                                          callback=lambda _f: state.update(selected=True))
                deadline = time.monotonic() + 5
                while not state["selected"]:
                    conn.process_data_events(time_limit=0.05)
                    if time.monotonic() > deadline:
                        raise RuntimeError("confirm.select timed out")
                next_at = time.monotonic()
                while not self.stop_all.is_set():
                    now = time.monotonic()
                    if outstanding and now - next(iter(outstanding.values()))[1] > a.confirm_timeout:
                        with self.lock:
                            self.stats["confirm_timeouts"] += 1
                        raise RuntimeError("confirm timeout")
                    done = self.stop_publish.is_set() and not resend
                    if done and not outstanding:
                        break
                    sent = 0
                    while (not done and len(outstanding) < a.window and now >= next_at
                           and sent < 20):
                        with self.lock:
                            if resend:
                                mid = resend.popleft()
                            elif self.stop_publish.is_set():
                                break
                            else:
                                mid = q.next_id
                                q.next_id += 1
                            attempt = q.sends.get(mid, 0) + 1
                            q.sends[mid] = attempt
                            if a.trace_dups:
                                q.sent_at[(mid, attempt)] = (self.now(), member.name)
                        state["tag"] += 1
                        outstanding[state["tag"]] = (mid, now)
                        try:
                            ch._impl.basic_publish("", q.name, b"%d:%d" % (mid, attempt), props)
                        except Exception:
                            outstanding.pop(state["tag"], None)
                            with self.lock:
                                resend.appendleft(mid)
                            raise
                        sent += 1
                        next_at = next_at + period if period else now
                        if period and next_at < now - 1.0:
                            next_at = now        # do not burst after a stall
                    # Wait for confirms, or until the next publish is due (never
                    # a busy loop: confirms do not end the wait early).
                    if done or len(outstanding) >= a.window or period == 0:
                        wait = 0.005
                    else:
                        wait = min(0.05, max(0.002, next_at - time.monotonic()))
                    conn.process_data_events(time_limit=wait)
                conn.close()
                if self.stop_publish.is_set() and not resend and not outstanding:
                    return
            except Exception as e:
                self.publisher_on.pop((q.name, start), None)
                with self.lock:
                    self.stats["publish_reconnects"] += 1
                    # everything not confirmed is sent again (at-least-once)
                    for mid, _ in outstanding.values():
                        resend.append(mid)
                    outstanding.clear()
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                if os.environ.get("SOAK_DEBUG"):
                    self.log("publisher %s on %s: %s: %s" % (q.name, member.name,
                                                             type(e).__name__, e))
                time.sleep(0.2)

    def consumer(self, q, start):
        k = start
        while not self.stop_all.is_set():
            member = self.members[k % len(self.members)]
            k += 1
            if not member.alive():
                time.sleep(0.05)
                continue
            conn = None
            try:
                conn = self.connect(member)
                ch = conn.channel()
                ch.basic_qos(prefetch_count=100)
                cancelled = []
                ch.add_on_cancel_callback(lambda f: cancelled.append(f))

                def on_message(ch_, m, p, body):
                    mid, attempt = (int(x) for x in body.split(b":"))
                    with self.lock:
                        seen = q.received.get(mid)
                        if seen is None:
                            q.received[mid] = {attempt}
                        else:
                            if attempt not in seen:
                                q.dup["resent"] += 1
                            elif m.redelivered:
                                q.dup["redelivered"] += 1
                            else:
                                q.dup["unflagged"] += 1
                                q.unflagged.append((mid, attempt))
                            seen.add(attempt)
                        if self.a.trace_dups:
                            q.deliveries[(mid, attempt)].append(
                                (self.now(), member.name, bool(m.redelivered)))
                        q.last_delivery = time.monotonic()
                    ch_.basic_ack(m.delivery_tag)
                ch.basic_consume(q.name, on_message)
                q.last_delivery = time.monotonic()
                while not self.stop_all.is_set():
                    conn.process_data_events(time_limit=0.2)
                    if cancelled:
                        with self.lock:
                            self.stats["consumer_cancelled"] += 1
                        raise RuntimeError("cancelled by the broker")
                    idle = time.monotonic() - q.last_delivery
                    if idle > self.a.consumer_idle:
                        with self.lock:
                            behind = len(q.confirmed) > 0 and \
                                not q.confirmed.issubset(q.received.keys())
                        if behind:
                            with self.lock:
                                self.stats["consumer_idle_reconnects"] += 1
                            self.log("consumer of %s idle %.0f s on %s with confirmed messages "
                                     "not received: reconnecting" % (q.name, idle, member.name))
                            raise RuntimeError("idle")
                        q.last_delivery = time.monotonic()
                conn.close()
                return
            except Exception as e:
                with self.lock:
                    self.stats["consume_reconnects"] += 1
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                if os.environ.get("SOAK_DEBUG"):
                    self.log("consumer %s on %s: %s: %s" % (q.name, member.name,
                                                            type(e).__name__, e))
                time.sleep(0.2)

    # -- faults --------------------------------------------------------------
    def max_impaired(self):
        return (len(self.members) - 1) // 2

    def impaired(self):
        s = set(self.killed) | self.died
        if self.net:
            s |= set(self.net[2] if self.net[0] == "partition" else self.net[1])
        return s

    def primaries(self):
        """{queue: primary broker} from the first live broker that answers."""
        for m in self.members:
            if m.alive():
                try:
                    return {q["name"]: q.get("primary") for q in self.api_queues(m)}
                except Exception:
                    continue
        return {}

    def pick_biased(self, candidates, local_publisher=False):
        """A primary of a random queue among candidates (3 in 4), else any.
        local_publisher: prefer a queue whose publisher is connected to its
        primary (a cut then tests an isolated primary with its own client)."""
        if self.rng.random() < 0.75:
            qs = list(self.queues)
            self.rng.shuffle(qs)
            prim = self.primaries()
            on = collections.defaultdict(set)
            for (qn, _), b in list(self.publisher_on.items()):
                on[qn].add(b)
            if local_publisher:
                qs.sort(key=lambda q: prim.get(q.name) not in on[q.name])
            for q in qs:
                m = next((c for c in candidates if c.name == prim.get(q.name)), None)
                if m is not None:
                    local = m.name in on[q.name]
                    return m, "primary of %s%s" % (q.name, ", its publisher on it" if local else "")
        return self.rng.choice(candidates), "random"

    def allowed_actions(self):
        acts = []
        room = self.max_impaired() - len(self.impaired())
        now = time.monotonic()
        old = lambda key: now - self.fault_since.get(key, 0) >= self.a.fault_down  # noqa: E731
        if "kill" in self.a.faults and room >= 1:
            acts.append("kill")
        if any(old(("kill", n)) for n in self.killed):
            acts.append("restart")
        if self.net is None and room >= 1:
            if "cut" in self.a.faults:
                acts.append("cut")
            if "partition" in self.a.faults:
                acts.append("partition")
        if self.net is not None and old(("net",)):
            acts.append("heal")
        if "move" in self.a.faults and len(self.live_unimpaired()) >= 2:
            acts.append("move")
        if "drain" in self.a.faults and self.draining is None and len(self.live_unimpaired()) >= 3:
            acts.append("drain")
        if self.draining is not None and old(("drain",)):
            acts.append("revive")
        return acts

    def check_deaths(self):
        """A broker that exited without our kill -9 is a failure (a crash, a
        sanitizer report); it is not restarted."""
        for m in self.members:
            if not m.alive() and m.name not in self.killed and m.name not in self.died:
                self.died.add(m.name)
                self.fail("%s exited on its own (status %s): see %s" % (
                    m.name, m.proc.returncode, m.log_path))

    def fault_tick(self):
        self.check_deaths()
        acts = self.allowed_actions()
        if not acts:
            return
        fresh = [x for x in acts if not self.kinds_done[x]]
        act = self.rng.choice(fresh or acts)
        self.kinds_done[act] += 1
        getattr(self, "do_" + act)()
        if act in ("restart", "heal") and not self.impaired():
            self.wait_restored(act)

    def live_unimpaired(self):
        imp = self.impaired()
        return [m for m in self.members if m.alive() and m.name not in imp]

    def do_kill(self):
        victim, why = self.pick_biased(self.live_unimpaired())
        victim.kill()
        self.killed.add(victim.name)
        self.fault_since[("kill", victim.name)] = time.monotonic()
        self.stats["kills"] += 1
        self.log("kill -9 %s (%s); %s" % (victim.name, why, self.counts()))

    def do_restart(self):
        name = self.rng.choice(sorted(n for n in self.killed
                                      if time.monotonic() - self.fault_since[("kill", n)]
                                      >= self.a.fault_down))
        m = self.cluster.member(name)
        self.incarnation[name] += 1
        m.start()
        self.killed.discard(name)
        self.stats["restarts"] += 1
        self.log("restarted %s; %s" % (name, self.counts()))

    def do_cut(self):
        victim, why = self.pick_biased(self.live_unimpaired(), local_publisher=True)
        rest = [m for m in self.members if m is not victim]
        self.lab.partition([victim.index], [m.index for m in rest])
        self.net = ("cut", [victim.name], [m.name for m in rest])
        self.fault_since[("net",)] = time.monotonic()
        self.net_faults.append({"kind": "cut", "start": time.monotonic(), "end": None,
                                "minority": {victim.name}, "majority": set(self.net[2])})
        self.stats["cuts"] += 1
        self.log("cut %s from the others (%s); %s" % (victim.name, why, self.counts()))

    def do_partition(self):
        room = self.max_impaired() - len(self.impaired())
        size = self.rng.randint(1, room)
        candidates = [m for m in self.members if m.name not in self.killed]
        minority = []
        leaders = self.cluster.leaders(self.live_unimpaired())
        if leaders and self.rng.random() < 0.75:
            minority.append(leaders[0])
        pool = [m for m in candidates if m not in minority]
        self.rng.shuffle(pool)
        while len(minority) < size and pool:
            minority.append(pool.pop())
        majority = [m for m in self.members if m not in minority]
        self.lab.partition([m.index for m in majority], [m.index for m in minority])
        self.net = ("partition", [m.name for m in majority], [m.name for m in minority])
        self.fault_since[("net",)] = time.monotonic()
        self.net_faults.append({"kind": "partition", "start": time.monotonic(), "end": None,
                                "minority": set(self.net[2]), "majority": set(self.net[1])})
        self.stats["partitions"] += 1
        self.log("partition %s | %s%s; %s" % (
            "".join(self.net[1]), "".join(self.net[2]),
            " (the minority holds the leader)" if leaders and leaders[0] in minority else "",
            self.counts()))

    def do_move(self):
        live = self.live_unimpaired()
        via = self.rng.choice(live)
        q = self.rng.choice(self.queues)
        try:
            primary = next((x["primary"] for x in self.api_queues(via) if x["name"] == q.name),
                           None)
            to = self.rng.choice([m for m in live if m.name != primary])
            status, body = via.api_call("POST", "/api/cluster/move",
                                        {"queue": q.name, "to": to.name}, timeout=5)
        except Exception as e:  # noqa: BLE001 (a broker busy with a fault: not a failure)
            self.log("move of %s not asked: %s" % (q.name, e))
            return
        self.stats["moves"] += 1
        self.log("move %s from %s to %s (through %s): %s %s; %s" % (
            q.name, primary, to.name, via.name, status,
            body.get("reason", "started") if isinstance(body, dict) else body, self.counts()))

    def do_drain(self):
        live = self.live_unimpaired()
        victim, via = self.rng.choice(live), self.rng.choice(live)
        try:
            status, body = via.api_call("POST", "/api/cluster/drain", {"broker": victim.name},
                                        timeout=5)
        except Exception as e:  # noqa: BLE001 (a broker busy with a fault: not a failure)
            self.log("drain of %s not asked: %s" % (victim.name, e))
            return
        if status == 202:
            self.draining = victim.name
            self.fault_since[("drain",)] = time.monotonic()
        self.stats["drains"] += 1
        self.log("drain %s (through %s): %s %s; %s" % (
            victim.name, via.name, status,
            body.get("reason", "started") if isinstance(body, dict) else body, self.counts()))

    def do_revive(self):
        live = self.live_unimpaired()
        via = self.rng.choice(live)
        try:
            status, body = via.api_call("POST", "/api/cluster/revive", {"broker": self.draining},
                                        timeout=5)
        except Exception as e:  # noqa: BLE001
            self.log("revive of %s not asked: %s" % (self.draining, e))
            return
        # 409: it died and came back up meanwhile (a restart ends a drain).
        self.log("revive %s (through %s): %s %s; %s" % (
            self.draining, via.name, status,
            body.get("reason", "revived") if isinstance(body, dict) else body, self.counts()))
        self.draining = None
        self.stats["revives"] += 1

    def do_heal(self):
        kind = self.net[0]
        self.lab.heal()
        self.net_faults[-1]["end"] = time.monotonic()
        self.net = None
        self.stats["heals"] += 1
        self.log("healed the %s; %s" % (kind, self.counts()))

    # -- replication factor --------------------------------------------------
    def restored(self):
        """None when every broker shows every queue whole and the same; else why not."""
        placement = {}
        problems = []
        for m in self.members:
            try:
                qs = {q["name"]: q for q in self.api_queues(m)}
            except Exception as e:
                return "%s: /api/queues: %s" % (m.name, e)
            for q in self.queues:
                info = qs.get(q.name)
                if info is None:
                    problems.append("%s does not know %s" % (m.name, q.name))
                    continue
                backups, in_sync = info.get("backups") or [], info.get("in_sync") or []
                if not info.get("available", True) or info.get("primary") is None:
                    problems.append("%s: %s not available" % (m.name, q.name))
                elif len(backups) != q.backups or sorted(in_sync) != sorted(backups):
                    problems.append("%s: %s primary %s backups %s in sync %s (wants %d)" % (
                        m.name, q.name, info["primary"], ",".join(backups) or "-",
                        ",".join(in_sync) or "-", q.backups))
                else:
                    where = (info["primary"], tuple(sorted(backups)))
                    if placement.setdefault(q.name, where) != where:
                        problems.append("%s: %s placed %s, elsewhere %s" % (
                            m.name, q.name, where, placement[q.name]))
            if problems:
                return "; ".join(problems)   # one broker's view is enough to say why
        return None

    def wait_restored(self, after):
        t0 = time.monotonic()
        why = "not checked"
        while time.monotonic() - t0 < self.a.restore_timeout:
            why = self.restored()
            if why is None:
                dt = time.monotonic() - t0
                self.restores.append((after, dt))
                self.log("every queue at its factor, in sync, %.2f s after %s" % (dt, after))
                return True
            time.sleep(0.1)
        self.restores.append((after, None))
        self.fail("factor not restored %.0f s after %s: %s" % (self.a.restore_timeout, after, why))
        self.log_raft_state()
        return False

    def log_raft_state(self):
        """What each broker's consensus says (/api/cluster "raft"): where its
        log is and, on the leader, each follower's replication state; the
        first thing to read when a broker keeps an old map."""
        for m in self.members:
            v = m.api_cluster() or {}
            r = v.get("raft")
            if not r:
                self.log("  %s: no /api/cluster" % m.name)
                continue
            followers = " ".join("%s:%s next=%d match=%d%s" % (
                f.get("name") or f["id"], f["state"], f["next_index"], f["match_index"],
                "" if f["heard"] else " unheard") for f in r.get("followers", []))
            self.log("  %s: leader %s epoch %s term %d last %d commit %d applied %d "
                     "snapshot_busy_ms %d%s" % (
                         m.name, v.get("leader"), v.get("epoch"), r["term"], r["last_index"],
                         r["commit_index"], r["applied_index"], r["snapshot_busy_ms"],
                         "; " + followers if followers else ""))

    # -- the run -------------------------------------------------------------
    def run(self):
        a = self.a
        self.setup()
        pollers = [threading.Thread(target=self.poller, args=(m,), daemon=True)
                   for m in self.members]
        n = len(self.members)
        clients = []
        pubs = []
        step = max(1, n // max(1, a.publishers))
        for q in self.queues:
            for j in range(a.publishers):
                pubs.append(threading.Thread(target=self.publisher,
                                             args=(q, (q.index + j * step) % n), daemon=True))
            clients.append(threading.Thread(target=self.consumer, args=(q, (q.index + 1) % n),
                                            daemon=True))
        clients += pubs
        for t in pollers + clients:
            t.start()
        self.t0 = time.monotonic()
        next_tick = self.t0 + a.fault_every
        while time.monotonic() < self.t0 + a.seconds:
            time.sleep(max(0.0, min(next_tick, self.t0 + a.seconds) - time.monotonic()))
            if time.monotonic() >= self.t0 + a.seconds:
                break
            self.fault_tick()
            next_tick = max(next_tick + a.fault_every, time.monotonic() + 1.0)
        # End: repair everything, wait for the factor, stop publishing, drain.
        if self.net:
            self.do_heal()
        for name in sorted(self.killed):
            self.fault_since[("kill", name)] = 0
            self.do_restart()
        self.wait_restored("the end of the faults")
        self.stop_publish.set()
        for t in pubs:
            t.join(60)
        if any(t.is_alive() for t in pubs):
            self.fail("a publisher still had unconfirmed messages 60 s after the end")
            self.stop_all.set()
        # Drain: until every confirmed message arrived, or no progress for 20 s.
        last, last_change = None, time.monotonic()
        while time.monotonic() - last_change < 20:
            with self.lock:
                missing = sum(len(q.confirmed - q.received.keys()) for q in self.queues)
                got = sum(len(q.received) for q in self.queues)
            if missing == 0:
                break
            if got != last:
                last, last_change = got, time.monotonic()
            time.sleep(0.2)
        time.sleep(1.0)   # late duplicates, last polls
        self.stop_all.set()
        for t in clients:
            t.join(10)
        return self.report()

    def print_unflagged(self):
        """--trace-dups: the first unflagged duplicates, each with its publish
        and every delivery of it (soak times, as the fault log's)."""
        shown = 0
        with self.lock:
            for q in self.queues:
                for key in q.unflagged:
                    if shown >= self.a.trace_dups:
                        return
                    shown += 1
                    sent = q.sent_at.get(key, (0.0, "?"))
                    print("UNFLAGGED %s m%d attempt %d: published %.3f s via %s; delivered %s" % (
                        q.name, key[0], key[1], sent[0], sent[1],
                        ", ".join("%.3f s via %s%s" % (t, b, " (redelivered)" if r else "")
                                  for t, b, r in q.deliveries[key])))

    def report(self):
        a = self.a
        self.check_deaths()
        with self.lock:
            confirmed = sum(len(q.confirmed) for q in self.queues)
            received = sum(len(q.received) for q in self.queues)
            dup = collections.Counter()
            for q in self.queues:
                dup.update(q.dup)
            nacked = sum(q.nacked for q in self.queues)
            lost = {q.name: sorted(q.confirmed - q.received.keys()) for q in self.queues}
            records = dict(self.records)
        n_lost = sum(len(v) for v in lost.values())
        for qn, ids in lost.items():
            if ids:
                self.fail("%s: %d confirmed messages lost, e.g. %s" % (qn, len(ids), ids[:10]))
        self.print_unflagged()
        for q in self.queues:
            print("QUEUE %s backups=%d %s confirmed=%d received=%d dup=%d nacked=%d lost=%d" % (
                q.name, q.backups, "persistent" if q.persistent else
                "transient, non-durable" if self.a.non_durable else "transient",
                len(q.confirmed), len(q.received), sum(q.dup.values()), q.nacked,
                len(lost[q.name])))
        path = os.path.join(self.cluster.dir, "confirms.json")
        with open(path, "w") as f:
            json.dump([dict(broker=k[0], incarnation=k[1], queue=k[2], epoch=k[3], **v)
                       for k, v in sorted(records.items())], f, indent=1)
        if not self.confirms_seen:
            split = "n/a"
            print("SPLIT-BRAIN check not available: /api/queues has no \"confirms\" field "
                  "(the brokers do not report their confirming epochs)")
        else:
            violations, st = check_split_brain(records)
            for v in violations:
                self.fail("split brain: " + v)
            split = len(violations)
            print("SPLIT-BRAIN epochs_with_confirms=%d pairs=%d worst_margin_ms=%s (%s) "
                  "violations=%d serving_overlap_samples=%d" % (
                      st["epochs"], st["pairs"], st["worst_margin_ms"], st["worst"] or "-",
                      len(violations), self.serving_overlaps))
        cv, cst = check_client_split(self.net_faults, {q.name: q.acks for q in self.queues})
        for v in cv:
            if self.a.client_split == "fail":
                self.fail("split brain seen by the clients: " + v)
            else:
                print("# WARNING split brain seen by the clients: " + v)
        print("CLIENT-SPLIT net_faults=%d both_sides_confirmed=%d worst_margin_ms=%s (%s) "
              "violations=%d minority_confirms_after_%dms=%d" % (
                  len(self.net_faults), cst["both"], cst["worst_margin_ms"], cst["worst"] or "-",
                  len(cv), int(GRACE * 1000), cst["minority_acks"]))
        times = [t for _, t in self.restores if t is not None]
        print("RESTORE checks=%d restored=%d max_s=%s mean_s=%s failed=%d" % (
            len(self.restores), len(times), "%.2f" % max(times) if times else "-",
            "%.2f" % (sum(times) / len(times)) if times else "-",
            sum(1 for _, t in self.restores if t is None)))
        print("RESULT seconds=%.0f seed=%d brokers=%d queues=%d kills=%d restarts=%d cuts=%d "
              "partitions=%d heals=%d moves=%d drains=%d revives=%d confirmed=%d received=%d duplicates=%d dup_resent=%d "
              "dup_redelivered=%d dup_unflagged=%d nacked=%d lost=%d split_brain=%s "
              "restore_failed=%d publish_reconnects=%d consume_reconnects=%d "
              "confirm_timeouts=%d consumer_idle_reconnects=%d consumer_cancelled=%d" % (
                  self.now(), a.seed, len(self.members), len(self.queues), self.stats["kills"],
                  self.stats["restarts"], self.stats["cuts"], self.stats["partitions"],
                  self.stats["heals"], self.stats["moves"], self.stats["drains"],
                  self.stats["revives"], confirmed, received, sum(dup.values()), dup["resent"],
                  dup["redelivered"], dup["unflagged"], nacked, n_lost, split,
                  sum(1 for _, t in self.restores if t is None),
                  self.stats["publish_reconnects"], self.stats["consume_reconnects"],
                  self.stats["confirm_timeouts"], self.stats["consumer_idle_reconnects"],
                  self.stats["consumer_cancelled"]), flush=True)
        for kind in sorted(self.a.faults):
            if not self.stats[{"kill": "kills", "cut": "cuts", "partition": "partitions",
                                "move": "moves", "drain": "drains"}[kind]]:
                print("# note: no %s fault in this run (too short for FAULT_EVERY=%g?)" % (
                    kind, a.fault_every))
        if confirmed == 0:
            self.fail("nothing was confirmed")
        return not self.failures

    def close(self, ok):
        problems = []
        if self.cluster is not None:
            self.cluster.failed = not ok or bool(self.a.trace_dups)
            problems = self.cluster.close() or []
        if self.lab is not None:
            self.lab.close()
        for p in problems:
            print("FAIL %s" % p)
        return ok and not problems


def main():
    args = parse_args(sys.argv[1:])
    if args.selftest:
        selftest()
        return 0
    if args.netns and os.geteuid() != 0:
        if os.environ.get("SKIP_WITHOUT_ROOT"):
            print("skipped: network namespaces need root (NETNS=0 runs on loopback)")
            return 77
        raise SystemExit("network namespaces need root (NETNS=0 runs on loopback, kill -9 only)")
    if args.seed is None:
        args.seed = random.randrange(1, 1 << 31)
    soak = Soak(args)
    ok = False
    try:
        ok = soak.run()
    except BaseException as e:
        print("FAIL %s: %s" % (type(e).__name__, e), flush=True)
        raise
    finally:
        ok = soak.close(ok)
        if soak.failures:
            print("FAILURES:\n  " + "\n  ".join(soak.failures))
        print("PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
