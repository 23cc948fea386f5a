"""Goal: GET /metrics (Prometheus text format 0.0.4) says what AMQP did.

What must hold, on one broker and on a 3-broker cluster (QUAY_TEST_MODE):
- only a login with the monitoring tag (or administrator) may scrape: no
  or wrong credentials get RabbitMQ's 401 with its challenge, a
  management-only user 401 "Not monitor user";
- the answer is text/plain; version=0.0.4, accepted by `promtool check
  metrics` (Debian's prometheus package, scripts/setup.sh) and by the
  strict reader below (every family's HELP, TYPE and samples together,
  names and labels well formed, no series twice, counters end in _total);
- per-queue samples (RabbitMQ's names, labels vhost and queue) come from
  the broker that is the queue's primary only, so summed over the brokers
  they equal what AMQP did: N published, M fetched and acked, K delivered
  and left unacked to a consumer;
- the global counters of the broker the client talks to move by exactly
  what the client did (received, confirmed, routed, unroutable, delivered
  by mode, acknowledged);
- in a cluster the quay_ families agree with the map: one primary and one
  backup per queue (--default-backups 1), the backup in sync, every broker
  up, one leader, the same epoch everywhere; outside a cluster there are
  none.

Method: one quayd (or cluster) with the API on and a users file of guest
(administrator), a monitoring and a management user; pika through the
client's broker; every broker scraped with http.client.
"""
import atexit
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quaytest  # noqa: E402
from quaytest import *  # noqa: E402,F403

QUAYD = os.environ.get("QUAYD", "")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
USERS = {
    "guest": ("guest", "/", "loopback tags=administrator"),
    "mon": ("mon-pw", "/", "tags=monitoring"),
    "mgmt": ("mgmt-pw", "/", "tags=management"),
}


def users_file():
    d = tempfile.mkdtemp(prefix="quay-itest-users-")
    atexit.register(shutil.rmtree, d, True)
    path = os.path.join(d, "users")
    with open(path, "w") as f:
        for name, (pw, vhosts, words) in USERS.items():
            pw_hash = subprocess.run([QUAYD, "--hash-password", pw], capture_output=True,
                                     text=True, check=True, timeout=30).stdout.strip()
            f.write("%s %s %s %s\n" % (name, pw_hash, vhosts, words))
    return path


# The broker every test of this file uses (and run() checks and stops).
quaytest._broker = Broker(["--users", users_file()], external_ok=False, http=True)


def http_ports():
    """{broker name: API port}: every broker of the cluster, or the one."""
    b = broker()
    if CLUSTERED:
        return {m.name: m.http_port for m in b.members}
    return {"local": b.http_port}


def scrape_raw(port=None, user="mon", password=None, method="GET"):
    c = http.client.HTTPConnection("127.0.0.1", port or broker().http_port, timeout=10)
    h = {}
    if user is not None:
        h["Authorization"] = api_authorization(user, password or USERS[user][0])
    try:
        c.request(method, "/metrics", headers=h)
        r = c.getresponse()
        return r.status, r.headers, r.read()
    finally:
        c.close()


# ---- a strict reader of the text format ------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"'
SAMPLE_RE = re.compile(r"^(%s)(?:\{(%s(?:,%s)*)\})? (-?[0-9]+(?:\.[0-9]+)?)$" % (NAME, LABEL, LABEL))
LABEL_RE = re.compile(LABEL)


def unescape(v):
    return re.sub(r'\\(["\\n])', lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse(text):
    """{(name, frozenset(labels.items())): value}, and {name: type}; raises
    AssertionError on anything the 0.0.4 format (or our own rules) does not
    allow."""
    assert text.endswith("\n"), "the text ends with a line feed"
    samples, types, done = {}, {}, set()
    family = None
    lines = text[:-1].split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^# HELP (%s) \S.*$" % NAME, line)
        assert m, "line %d: HELP expected, got %r" % (i + 1, line)
        family = m.group(1)
        assert family not in done, "family %s appears twice" % family
        done.add(family)
        assert i + 1 < len(lines), "TYPE after HELP"
        m = re.match(r"^# TYPE (%s) (gauge|counter)$" % NAME, lines[i + 1])
        assert m and m.group(1) == family, "line %d: TYPE of %s" % (i + 2, family)
        types[family] = m.group(2)
        if m.group(2) == "counter":
            assert family.endswith("_total"), "counter %s ends in _total" % family
        i += 2
        while i < len(lines) and not lines[i].startswith("#"):
            m = SAMPLE_RE.match(lines[i])
            assert m, "line %d: not a sample: %r" % (i + 1, lines[i])
            assert m.group(1) == family, "line %d: sample of %s inside %s" % (
                i + 1, m.group(1), family)
            labels = {k: unescape(v) for k, v in LABEL_RE.findall(m.group(2) or "")}
            key = (family, frozenset(labels.items()))
            assert key not in samples, "series twice: %r" % (key,)
            text = m.group(m.lastindex)  # integers, but durations in seconds
            samples[key] = float(text) if "." in text else int(text)
            i += 1
    return samples, types


def scrape(port=None):
    status, headers, body = scrape_raw(port)
    eq(status, 200, "GET /metrics")
    eq(headers["Content-Type"], CONTENT_TYPE, "content type")
    eq(int(headers["Content-Length"]), len(body), "content length")
    return parse(body.decode("utf-8"))[0]


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def per_queue(samples, name, queue):
    return value(samples, name, vhost="/", queue=queue)


def scrape_all():
    return {name: scrape(port) for name, port in http_ports().items()}


def queue_sum(all_samples, name, queue):
    """The queue's samples over every broker: (sum, how many brokers had one)."""
    got = [per_queue(s, name, queue) for s in all_samples.values()]
    got = [v for v in got if v is not None]
    return sum(got), len(got)


# ---- tests -----------------------------------------------------------------

@test
def scraping_needs_the_monitoring_tag():
    status, headers, _ = scrape_raw(user=None)
    eq(status, 401, "no credentials")
    eq(headers["WWW-Authenticate"], 'Basic realm="RabbitMQ Management"', "challenge")
    eq(scrape_raw(user="mon", password="wrong")[0], 401, "wrong password")
    status, headers, body = scrape_raw(user="mgmt")
    eq(status, 401, "management user")
    assert b"Not monitor user" in body, body
    eq(scrape_raw(user="mon")[0], 200, "monitoring user")
    eq(scrape_raw(user="guest")[0], 200, "administrator")
    status, headers, body = scrape_raw(method="HEAD")
    eq((status, body), (200, b""), "HEAD")
    eq(headers["Content-Type"], CONTENT_TYPE, "HEAD's content type")


@test
def promtool_accepts_every_brokers_answer():
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/setup.sh installs Debian's prometheus package"
    for name, port in http_ports().items():
        _, _, body = scrape_raw(port)
        r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                           timeout=60)
        eq((r.returncode, r.stdout + r.stderr), (0, b""), "promtool on %s" % name)
        parse(body.decode("utf-8"))  # and the strict reader


def the_reader_refuses_what_the_format_does_not_allow():
    # The strict reader must be able to fail, or the test above proves nothing.
    good = "# HELP a_total x\n# TYPE a_total counter\na_total{q=\"\\\"\"} 1\n"
    parse(good)
    for bad in (good.replace("a_total{", "b_total{"),         # sample outside its family
                good + good,                                  # a family twice
                good + 'a_total{q="\\""} 2\n',             # a series twice
                good.replace("_total", ""),                   # counter without _total
                good.replace("} 1", "} x"),                   # not a number
                good.replace('q="', 'q=')):                   # label unquoted
        try:
            parse(bad)
        except AssertionError:
            continue
        raise AssertionError("the reader accepted %r" % bad)


test(the_reader_refuses_what_the_format_does_not_allow)

N, M, K = 20, 7, 3   # published to each queue; fetched and acked from q0; left unacked on q1
QUEUES = ["metrics.q0", "metrics.q1", "metrics.odd \"name\"\\"]


def counters(samples):
    names = ["received", "received_confirm", "routed", "unroutable_dropped",
             "unroutable_returned", "confirmed", "delivered", "delivered_get_manual_ack",
             "delivered_consume_manual_ack", "acknowledged"]
    return {n: value(samples, "rabbitmq_global_messages_%s_total" % n, protocol="amqp091")
            for n in names}


@test(timeout=120)
def values_match_what_amqp_did():
    client_port = broker().http_port
    before = counters(scrape(client_port))
    assert None not in before.values(), before
    conn = pika_connect()
    ch = conn.channel()
    for q in QUEUES:
        ch.queue_declare(q)
    ch.confirm_delivery()
    for q in QUEUES:
        for i in range(N):
            ch.basic_publish("", q, b"m%d" % i)
    ch.basic_publish("", "metrics.nowhere", b"lost")  # unroutable, not mandatory: dropped
    for _ in range(M):
        method, _, _ = ch.basic_get(QUEUES[0])
        ch.basic_ack(method.delivery_tag)
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=K)
    consumer.basic_consume(QUEUES[1], lambda *a: None)
    wait_until(lambda: conn.process_data_events(0.05) or
               queue_sum(scrape_all(), "rabbitmq_queue_messages_unacked", QUEUES[1])[0] == K,
               timeout=20, what="K unacked on q1")

    def settled():
        s = scrape_all()
        want = {QUEUES[0]: (N - M, 0, 0), QUEUES[1]: (N - K, K, 1), QUEUES[2]: (N, 0, 0)}
        for q, (ready, unacked, consumers) in want.items():
            got = tuple(queue_sum(s, f, q) for f in ("rabbitmq_queue_messages_ready",
                                                     "rabbitmq_queue_messages_unacked",
                                                     "rabbitmq_queue_consumers"))
            if got != ((ready, 1), (unacked, 1), (consumers, 1)):
                return False
            if queue_sum(s, "rabbitmq_queue_messages", q) != (ready + unacked, 1):
                return False
        return s
    s = wait_until(settled, timeout=20, what="per-queue samples matching AMQP")
    # Each queue is shown by its primary only.
    for q in QUEUES:
        eq(queue_sum(s, "rabbitmq_queue_messages_ready", q)[1], 1, q + " shown once")
        # Every confirm came back: nothing waits for a backup any more.
        eq(queue_sum(s, "quay_queue_replication_lag_messages", q), (0, 1), q + " lag")
    after = counters(scrape(client_port))
    delta = {k: after[k] - before[k] for k in after}
    eq(delta, {"received": 3 * N + 1, "received_confirm": 3 * N + 1, "routed": 3 * N,
               "unroutable_dropped": 1, "unroutable_returned": 0, "confirmed": 3 * N + 1,
               "delivered": M + K, "delivered_get_manual_ack": M,
               "delivered_consume_manual_ack": K, "acknowledged": M},
       "the client's broker's counters")
    client = s["b" if CLUSTERED else "local"]
    eq(value(client, "rabbitmq_connections"), 1, "connections")
    eq(value(client, "rabbitmq_channels"), 2, "channels")
    eq(value(client, "rabbitmq_consumers"), 1, "consumers")
    if CLUSTERED:
        check_cluster(s)
    else:
        eq([k for k in s["local"] if k[0].startswith("quay_cluster")], [], "no cluster here")
        eq(value(s["local"], "rabbitmq_queues"), len(QUEUES), "queues")
    for q in QUEUES:
        ch.queue_delete(q)


@test(timeout=120)
def repeated_and_overlapping_scrapes_are_whole():
    # The answer's buffer is kept for the next scrape (metrics.c): scrapes
    # one after another, several at once (one writes while another's answer
    # is still being sent), and one after many queues went (a smaller
    # answer than the kept buffer) each answer a whole, current text.
    import threading
    c = pika_connect()
    ch = c.channel()
    names = ["scrape-keep-%03d" % i for i in range(300)]
    for n in names:
        ch.queue_declare(n)
    try:
        port = broker().http_port
        first = scrape(port)
        for _ in range(3):
            eq(set(scrape(port)) >= {k for k in first if k[0] == "rabbitmq_queue_messages"},
               True, "a repeated scrape has every queue's sample")
        out, errors = [], []

        def one():
            try:
                out.append(scrape_raw(port))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        eq(errors, [], "overlapping scrapes")
        for status, _, body in out:
            eq(status, 200, "an overlapping scrape")
            parse(body.decode("utf-8"))
        for n in names:
            ch.queue_delete(n)
        names = []
        after = scrape(port)
        assert not [k for k in after if dict(k[1]).get("queue", "").startswith("scrape-keep-")]
    finally:
        for n in names:
            ch.queue_delete(n)
        c.close()


STABLE, CHURNED, CHURNERS = 3000, 3000, 4


@test(timeout=300)
def queues_come_and_go_while_a_scrape_is_written():
    # A scrape is written a slice of ~1 ms a loop turn (metrics.c), walking
    # the queues with broker/queue_walk.h while other clients declare and
    # delete them between slices. Every answer must stay whole and well
    # formed (the strict reader: no series twice, even for a queue deleted
    # and declared again mid-scrape; promtool), show every queue that
    # stayed throughout, and the broker must read no freed queue (ASan).
    # Clients that go mid-scrape leave nothing behind. Queues that stay and
    # queues that churn are declared alternately, so the walk meets
    # deletions all along its way, and stands on queues being deleted.
    import threading
    import time
    c = pika_connect()
    ch = c.channel()
    stable = ["walk-stay-%04d" % i for i in range(STABLE)]
    churned = ["walk-churn-%04d" % i for i in range(CHURNED)]
    for a, b in zip(stable, churned):
        ch.queue_declare(a)
        ch.queue_declare(b)
    port = broker().http_port
    stop = threading.Event()
    done = []  # the time each churn operation was answered
    errors = []

    def churn(k):
        try:
            cc = pika_connect()
            cch = cc.channel()
            i = k
            while not stop.is_set():
                name = churned[(i * 7) % CHURNED]
                cch.queue_delete(name)
                done.append(time.monotonic())
                cch.queue_declare(name)
                done.append(time.monotonic())
                i += CHURNERS
            cc.close()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    # Several clients: in a cluster each change waits for the map (Raft).
    threads = [threading.Thread(target=churn, args=(k,)) for k in range(CHURNERS)]
    for t in threads:
        t.start()
    promtool = shutil.which("promtool")
    overlapped = []
    try:
        for n in range(8):
            if n % 2 == 1:  # a client that asks and goes before the answer
                sock = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                sock.request("GET", "/metrics",
                             headers={"Authorization": api_authorization("mon", "mon-pw")})
                sock.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            sent = time.monotonic()
            conn.request("GET", "/metrics",
                         headers={"Authorization": api_authorization("mon", "mon-pw")})
            r = conn.getresponse()
            first_byte = time.monotonic()
            body = r.read()
            conn.close()
            eq(r.status, 200, "a scrape during churn")
            eq(int(r.headers["Content-Length"]), len(body), "content length")
            overlapped.append(sum(1 for d in list(done) if sent < d < first_byte))
            samples, _ = parse(body.decode("utf-8"))
            # Every queue has a sample here: RabbitMQ's families on a single
            # broker; in a cluster at least quay_queue_role on every broker.
            shown = {dict(k[1]).get("queue") for k in samples}
            missing = [q for q in stable if q not in shown]
            eq(missing, [], "queues that stayed throughout are all shown")
            r2 = subprocess.run([promtool, "check", "metrics"], input=body,
                                capture_output=True, timeout=60)
            eq((r2.returncode, r2.stdout + r2.stderr), (0, b""), "promtool during churn")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    eq(errors, [], "the churning clients")
    # The scrapes were written while the churn went on: operations were
    # answered between a scrape's request and its first byte. Written in
    # one loop turn, only those around it were (four clients, ASan build:
    # 0-9, median 6-7, against the build before slices; sliced, 37-57,
    # and a median of 16 once in CI beside another test's brokers: the bar
    # is above what one turn ever gave, not near what slices give on a
    # quiet machine). In a cluster each change waits for Raft and every
    # broker, too slow to tell (0-5 either way): the single broker shows
    # the overlap, the cluster that the answer stays right.
    print("churn operations answered during each scrape's build: %r" % overlapped)
    if not CLUSTERED:
        assert sorted(overlapped)[len(overlapped) // 2] >= 12, overlapped
    after = scrape(port)  # whole and well formed after the clients that went
    shown = {dict(k[1]).get("queue") for k in after}
    eq([q for q in stable if q not in shown], [], "every queue that stayed, after")
    for q in stable + churned:
        ch.queue_delete(q)
    c.close()


def check_cluster(s):
    info = {q["name"]: q for q in broker().api_get("/api/queues")}
    names = sorted(s)
    for q in QUEUES:
        roles = {b: [dict(k[1])["role"] for k in s[b] if k[0] == "quay_queue_role" and
                     dict(k[1]).get("queue") == q] for b in names}
        eq(sorted(r for rs in roles.values() for r in rs), ["backup", "primary", "proxy"],
           q + ": roles over the brokers")
        primary = next(b for b in names if roles[b] == ["primary"])
        eq(primary, info[q]["primary"], q + ": the primary /api/queues names")
        eq(per_queue(s[primary], "quay_queue_backups", q), 1, q + ": backups")
        assert per_queue(s[primary], "rabbitmq_queue_messages_ready", q) is not None, q
    for b in names:
        for other in names:
            eq(value(s[b], "quay_cluster_broker_state", broker=other, state="up"), 1,
               "%s says %s is up" % (b, other))
            eq(value(s[b], "quay_cluster_broker_state", broker=other, state="down"), 0,
               "%s says %s is not down" % (b, other))
        assert value(s[b], "quay_raft_term") > 0, b
        assert value(s[b], "quay_raft_commit_index") > 0, b
        eq(value(s[b], "quay_cluster_link_up", peer=[x for x in names if x != b][0]), 1,
           b + "'s link")
    eq(sum(value(s[b], "quay_cluster_leader") for b in names), 1, "one leader")

    def in_step():
        s2 = scrape_all()
        epochs = {value(x, "quay_cluster_map_epoch") for x in s2.values()}
        in_sync = [per_queue(x, "quay_queue_backups_in_sync", q)
                   for x in s2.values() for q in QUEUES]
        return len(epochs) == 1 and sorted(v for v in in_sync if v is not None) == \
            [1] * len(QUEUES)
    wait_until(in_step, timeout=20, what="one epoch everywhere, every backup in sync")

@test(timeout=180)
def the_event_loop_lag_shows_a_stall():
    # quay_event_loop_lag_seconds is the longest loop iteration of the last
    # 5 to 10 s (net/loop_lag.h). A request the broker answers in one loop
    # turn (the lists, /api/queues, /api/bindings and the others, are built
    # in slices now: api_list_slices.c): a definitions import of 60,000
    # queues (4.9 MB) whose JSON breaks at its last byte, parsed whole in
    # one turn and refused (400, nothing imported). It holds the loop for
    # most of its time to first byte: the gauge must show at least half of it,
    # and once the window passed without such a request, drop back below
    # half. quay_event_loop_busy_seconds_total grows by at least the stall.
    # On a single broker: in a cluster the time to first byte also waits
    # for the primaries' counts, which is not the loop's work.
    import time
    s = scrape()
    assert value(s, "quay_event_loop_lag_seconds") is not None, "the lag is there"
    if CLUSTERED:
        return
    item = '{"name":"lag-%07d","vhost":"/","durable":true,"auto_delete":false,"arguments":{}},'
    body = ('{"queues":[' + "".join(item % i for i in range(60000)) + "{}],").encode()
    busy_before = value(scrape(), "quay_event_loop_busy_seconds_total")
    conn = http.client.HTTPConnection("127.0.0.1", broker().http_port, timeout=60)
    t0 = time.monotonic()
    conn.request("POST", "/api/definitions", body=body,
                 headers={"Authorization": api_authorization("guest", "guest"),
                          "Content-Type": "application/json"})
    r = conn.getresponse()
    first_byte = time.monotonic() - t0
    answer = r.read()
    conn.close()
    assert r.status == 400 and b"malformed JSON" in answer, (r.status, answer)
    s = scrape()
    lag = value(s, "quay_event_loop_lag_seconds")
    busy = value(s, "quay_event_loop_busy_seconds_total")
    assert lag >= first_byte / 2, (lag, first_byte)
    assert busy - busy_before >= first_byte / 2, (busy, busy_before, first_byte)
    time.sleep(10.5)
    lag = value(scrape(), "quay_event_loop_lag_seconds")
    assert lag < first_byte / 2, ("after the window", lag, first_byte)


if __name__ == "__main__":
    run()
