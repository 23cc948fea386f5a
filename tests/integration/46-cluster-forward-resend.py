"""Goal: a publish forwarded by a proxy is enqueued once even when the
proxy sends it again because the answer was lost: on one broker a
confirmed publish is in the queue once, so through a proxy it must be too.

Method: three quayd processes in network namespaces (tests/cluster/netlab.py);
a queue whose primary is b (backup a); publishers with confirms on c (the
proxy). The traffic from b to c is dropped, one way only: c's forwards
still reach b, which takes them, but b's confirms never come back, so c's
link to b dies of missed heartbeats with forwards unanswered, which c holds
and sends again once the link is back (after the heal). Every message is
then read: each id must be there exactly once (both copies of a resend
would sit at b unflagged), and none lost. Without the forward origins
(broker/origin.h) every publisher's in-flight message came out twice.
"""
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, broker_states as states, closer, connect_as,  # noqa: E402
                         declare_until, lab_trio, metric, queue_info, run, test,
                         wait_until)
from netlab import Lab  # noqa: E402

import pika  # noqa: E402

lab = cluster = None
A = B = C = None
USER, PASSWORD = "tester", "lab-pass"
PUBLISHERS = 4


def connect(member):
    return connect_as(member, USER, PASSWORD, socket_timeout=30, blocked_connection_timeout=60)


@test(timeout=120)
def three_brokers_in_three_hosts():
    global lab, cluster, A, B, C
    lab = Lab(3)
    cluster = Cluster()
    A, B, C = lab_trio(lab, cluster, ["--users", cluster.users_file(USER, PASSWORD)])


def duplicates(member):
    """quay_forward_duplicates_total in member's /metrics."""
    return metric(member, "quay_forward_duplicates_total")


def placed(prefix, want):
    """A durable queue with one backup declared through c (as our user)
    until one is placed as wanted."""
    return declare_until(prefix, C, want, connect_with=connect, **{"x-quay-backups": 1})


def cut_one_way(to_host, from_host):
    """Drops what from_host sends to to_host (inside to_host: its input)."""
    lab.exec(to_host, "nft", "add", "rule", "inet", "quaylab", "in", "ip", "saddr",
             lab.ip(from_host), "drop")


def heal_one_way(to_host):
    lab.exec(to_host, "nft", "flush", "chain", "inet", "quaylab", "in")
    lab.exec(to_host, "nft", "add", "rule", "inet", "quaylab", "in", "ip", "saddr", "@cut",
             "drop")


def publish(name, prefix, stop, sent, errors):
    """Publishes ids prefix-0, prefix-1, ... with confirms until stop is
    set; sent gets each id once its confirm (an ack) came."""
    try:
        conn = connect(C)
        ch = conn.channel()
        ch.confirm_delivery()
        i = 0
        while not stop.is_set():
            body = ("%s-%d" % (prefix, i)).encode()
            ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
            sent.append(body)
            i += 1
        conn.close()
    except Exception as e:  # noqa: BLE001 (reported by the test)
        errors.append(repr(e))


def start_publishers(name):
    stop = threading.Event()
    sent = [[] for _ in range(PUBLISHERS)]
    errors = []
    threads = [threading.Thread(target=publish, args=(name, "p%d" % i, stop, sent[i], errors))
               for i in range(PUBLISHERS)]
    for t in threads:
        t.start()
    wait_until(lambda: all(len(s) >= 20 for s in sent) or errors, 30,
               what="every publisher confirmed 20")
    assert not errors, errors
    return stop, sent, errors, threads


def cut_until_c_drops_its_link_to_b():
    """c's forwards still reach b; b's answers do not come back. c's link
    to b dies of silence (its heartbeats: a few seconds). Counted by c's own
    link going down: the "missed heartbeats" of c's server side, which this
    counted before, need b's link into c to be open (CI once had it in its
    handshake then, closed by the handshake timeout instead, while c's link
    had gone down as it should)."""
    down = "cluster: link to broker %d (" % B.broker_id()

    def downs():
        return sum(1 for line in C.log_text().splitlines()
                   if down in line and line.endswith("is down"))
    before = downs()
    cut_one_way(3, 2)
    t0 = time.monotonic()
    wait_until(lambda: downs() > before, 20, what="c to give up its link to b")
    print("# c dropped its link to b %.1f s after the cut" % (time.monotonic() - t0))


def finish_and_check(name, stop, sent, errors, threads, reader):
    """Lets the publishers go on, stops them, reads everything through
    reader: each confirmed id once, none lost."""
    counts = [len(s) for s in sent]
    wait_until(lambda: all(len(s) >= n + 10 for s, n in zip(sent, counts)) or errors,
               60, what="the publishers to go on")
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    conn = connect(reader)
    ch = conn.channel()
    got = {}
    while True:
        m, _, body = ch.basic_get(name, auto_ack=True)
        if m is None:
            break
        got.setdefault(body, []).append(m.redelivered)
    conn.close()
    confirmed = [b for s in sent for b in s]
    twice = {b: r for b, r in got.items() if len(r) > 1}
    lost = [b for b in confirmed if b not in got]
    print("# %d confirmed, %d read, %d twice, %d lost"
          % (len(confirmed), sum(map(len, got.values())), len(twice), len(lost)))
    assert not lost, lost[:10]
    assert not twice, sorted(twice.items())[:10]


@test(timeout=180)
def a_resent_forward_is_enqueued_once():
    """The link dies, the primary stays: c resends to b after the heal."""
    name = placed("resend", lambda q: q and q["primary"] == "b" and q.get("backups") == ["a"])
    stop, sent, errors, threads = start_publishers(name)
    cut_until_c_drops_its_link_to_b()
    heal_one_way(3)
    finish_and_check(name, stop, sent, errors, threads, B)
    assert states(A) == {"a": "up", "b": "up", "c": "up"}, states(A)
    assert queue_info(A, name)["primary"] == "b", queue_info(A, name)
    # And it was b that held the resends back (each publisher's message in
    # flight at the cut, at least).
    held_back = duplicates(B)
    print("# b held back %d resent forwards" % held_back)
    assert held_back >= PUBLISHERS, held_back


@test(timeout=180)
def a_resend_to_the_promoted_backup_is_enqueued_once():
    """The link dies, then the primary: c resends to a, promoted, which
    holds b's copies (replicated, flagged redelivered) and b's marks."""
    name = placed("promoted", lambda q: q and q["primary"] == "b"
                  and q.get("backups") == ["a"])
    before = duplicates(A)
    stop, sent, errors, threads = start_publishers(name)
    cut_until_c_drops_its_link_to_b()
    B.kill()
    heal_one_way(3)
    wait_until(lambda: (queue_info(C, name) or {}).get("primary") == "a", 20,
               what="a promoted")
    finish_and_check(name, stop, sent, errors, threads, A)
    held_back = duplicates(A) - before
    print("# a held back %d resent forwards" % held_back)
    assert held_back >= PUBLISHERS, held_back


if __name__ == "__main__":
    run(closer(lambda: cluster, lambda: lab))
