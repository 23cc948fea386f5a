"""Goal: the web console that quayd serves at "/" works in a real browser
against a real cluster: it logs in with a management user, its overview
shows the right totals, its queue list shows the queues, its cluster map
draws every broker on the ring with its state and share of the queues, one
queue's placement, and a broker killed with -9 as down. And, as plain HTTP:
the console's files are served without a login, with their Content-Type,
an ETag (304 when unchanged) and a Content-Security-Policy; an unknown
static path is 404; the API still requires a login.

Method: tests/cluster/clustertest.py forms three brokers (c1, c2, c3);
pika declares ten queues on c1 (with one backup each: the ring has pairs
to draw) and publishes to one. Debian's headless Chromium loads the console
from c1 (`--dump-dom` after `--virtual-time-budget`, so the page's fetches
and at least two of its 1.5 s refreshes have run); the credentials go in
the URL fragment, which the page moves into sessionStorage (it is never
sent to the server; the broker checks them as for any API client). The
DOM is read for what the page drew: elements with ids and data-
attributes (data-state, data-primaries), compared with what the API says.
A page left open logs in through its form as a person would (a wrong
password first, refused), then filters and sorts the queue list. Then,
with the cluster map open in a browser that keeps running (read
through the DevTools protocol over --remote-debugging-pipe, not reloaded),
c3 is killed with -9: the page's own refresh must draw it down within 10 s
(c1's map marks it down in about 1.5 s), and list the failovers as they
happen (GET /api/cluster/events: each queue of c3's moved, reason failover;
c3 down with its reason; red arrows from c3 on the ring); a page loaded
afresh draws it down too. Before that, with --catch-up-rate slowing the
catch-up of new backups (~12 s for MOVE_BYTES), open pages must draw a
planned move while it runs (its arrow, its row, "move started"), a backup a
policy added drawn catching up until it is in sync, and the overview's
publish rate above 0 under a publisher. Screenshots of the cluster map before and after the kill are
kept in the artefact directory ($QUAY_ARTIFACT_DIR, by default
test-artifacts/40-console beside $QUAYD, e.g. build-asan/test-artifacts/),
whose path is printed: the cluster's own directory, with the brokers' logs,
is removed when the test passes. Skipped (77) without chromium
(scripts/setup.sh installs it).
"""
import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
sys.path.insert(0, HERE)
from clustertest import (Cluster, closer, connect, declare_until, queue_info, run,  # noqa: E402
                         test, wait_until)
import pika  # noqa: E402
import threading  # noqa: E402
from chromium import CHROMIUM, CHROMIUM_FLAGS, LivePage  # noqa: E402

QUEUES = ["console-q-%d" % i for i in range(10)]
CATCH_UP_RATE = 256 * 1024  # bytes a second each broker sends to catch backups up
MOVE_BYTES = 3 * 1024 * 1024  # a queue this full takes ~12 s to catch up
ARTIFACTS = os.environ.get("QUAY_ARTIFACT_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(os.environ.get("QUAYD", "."))), "test-artifacts",
    "40-console")

cluster = None
c1 = c2 = c3 = None


def raw_get(member, path, headers=None, method="GET"):
    """(status, headers dict with lower-case names, body bytes), no login."""
    c = http.client.HTTPConnection(member.host, member.http_port, timeout=10)
    try:
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def browser(args, timeout=60):
    """Runs headless Chromium once with a profile of its own; returns stdout."""
    profile = tempfile.mkdtemp(prefix="quay-chromium-")
    try:
        argv = [CHROMIUM] + CHROMIUM_FLAGS + ["--user-data-dir=" + profile,
                                             "--window-size=1400,1100",
                                             "--virtual-time-budget=6000"] + args
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise AssertionError("chromium exited %d: %s" % (p.returncode, p.stderr[-2000:]))
        return p.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class ConsolePage(LivePage):
    """The console kept open (chromium.py's LivePage), so the test sees
    what the page's own refresh loop draws, in real time."""

    def brokers(self):
        """{name: state} as the ring draws them now."""
        return dict(self.evaluate(
            "[...document.querySelectorAll('#ring g.broker')]"
            ".map((g) => [g.dataset.name, g.dataset.state])") or [])

    def data(self, selector):
        """The data- attributes (and class) of each element selector finds."""
        return self.evaluate(
            "[...document.querySelectorAll(%s)].map((e) => Object.assign("
            "{class: e.getAttribute('class') || ''}, e.dataset))" % json.dumps(selector)) or []

    def events(self, **want):
        """The recent events the page lists (#cl-events), those with want."""
        return [e for e in self.data("#cl-events li")
                if all(e.get(k) == v for k, v in want.items())]

    def text(self, element_id):
        return self.evaluate("document.getElementById(%s)?.textContent" % json.dumps(element_id))


def page_url(member, fragment):
    user, password = cluster.api_user
    return "http://%s:%d/#%s&user=%s&password=%s" % (member.host, member.http_port, fragment,
                                                     user, password)


def dom(member, fragment):
    return browser(["--dump-dom", page_url(member, fragment)])


def screenshot(member, fragment, name):
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, name)
    browser(["--screenshot=" + path, page_url(member, fragment)])
    assert os.path.getsize(path) > 1000, "an empty screenshot"
    print("# screenshot: %s" % path)
    return path


def text_of(page, element_id):
    m = re.search(r'id="%s"[^>]*>([^<]*)<' % re.escape(element_id), page)
    assert m, "no element #%s in the page" % element_id
    return html.unescape(m.group(1)).strip()


def brokers_drawn(page):
    """{name: {"state": ..., "primaries": N, "backups": N}} from the ring."""
    out = {}
    for m in re.finditer(r'<g class="broker[^"]*"([^>]*)>', page):
        attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))
        out[attrs["name"]] = {"state": attrs["state"], "primaries": int(attrs["primaries"]),
                              "backups": int(attrs["backups"])}
    return out


def refreshes(page):
    m = re.search(r'<body[^>]*data-refreshes="(\d+)"', page)
    return int(m.group(1)) if m else 0


@test(timeout=180)
def cluster_with_queues():
    global cluster, c1, c2, c3
    cluster = Cluster()
    # New backups are caught up at CATCH_UP_RATE: a move of MOVE_BYTES, or a
    # backup added to a queue as full, stays in progress long enough to be
    # seen drawn (a_move_is_drawn_while_it_runs, a_backup_catching_up_...).
    c1, c2, c3 = cluster.form(["c1", "c2", "c3"],
                              extra_args=["--catch-up-rate", str(CATCH_UP_RATE)])
    conn = connect(c1)
    ch = conn.channel()
    for q in QUEUES:
        ch.queue_declare(q, durable=True, arguments={"x-quay-backups": 1})
    for i in range(5):
        ch.basic_publish("", QUEUES[0], b"m%d" % i)
    conn.close()
    wait_until(lambda: c1.api_get("/api/cluster/placement")["queues"] == len(QUEUES), 10,
               what="every queue in the map")
    # The pairs are the queues' own placements, summed (polled: a backup
    # may still be catching up between the two answers).
    def pairs():
        placement = c1.api_get("/api/cluster/placement")
        assert placement["unavailable"] == 0 and placement["alone"] == [], placement
        expect = {}
        for q in c1.api_get("/api/queues"):
            for b in q["backups"]:
                n = expect.setdefault((q["primary"], b), [0, 0])
                n[0] += 1
                n[1] += b in q["in_sync"]
        got = {(p["primary"], p["backup"]): [p["queues"], p["in_sync"]]
               for p in placement["pairs"]}
        return got if got == expect else None
    got = wait_until(pairs, 10, interval=0.2, what="the pairs to match the queues")
    assert sum(n for n, _ in got.values()) == len(QUEUES), got


@test
def static_files_over_plain_http():
    status, h, body = raw_get(c1, "/")
    assert status == 200, status
    assert h["content-type"] == "text/html; charset=utf-8", h
    assert b"/console.js" in body and b"<html" in body
    assert h["cache-control"] == "no-cache" and re.fullmatch(r'"[0-9a-f]{16}"', h["etag"]), h
    assert "default-src 'self'" in h["content-security-policy"], h
    assert h["x-content-type-options"] == "nosniff", h
    # Unchanged: 304 without the body.
    status, h2, body = raw_get(c1, "/", {"If-None-Match": h["etag"]})
    assert status == 304 and body == b"" and h2["etag"] == h["etag"], (status, h2, body)
    assert h2["content-length"] == h["content-length"], h2  # the 200's, or none (RFC 9110)
    status, h, body = raw_get(c1, "/console.js")
    assert status == 200 and h["content-type"] == "text/javascript; charset=utf-8", h
    status, h, _ = raw_get(c1, "/console.css")
    assert status == 200 and h["content-type"] == "text/css; charset=utf-8", h
    status, h, body = raw_get(c1, "/console.js", method="HEAD")
    assert status == 200 and body == b"" and int(h["content-length"]) > 1000, h
    for path in ("/nothing.js", "/console", "/index.html", "/console.js/x"):
        status, _, _ = raw_get(c1, path)
        assert status == 404, (path, status)
    status, _, _ = raw_get(c1, "/", method="POST")
    assert status == 405, status
    # The data still needs a login; the files do not make it any easier.
    for path in ("/api/overview", "/api/cluster", "/api/cluster/placement", "/api/queues"):
        status, h, _ = raw_get(c1, path)
        assert status == 401 and "www-authenticate" in h, (path, status)
    # The Host and Origin checks apply to the files too.
    status, _, _ = raw_get(c1, "/", {"Host": "evil.example"})
    assert status == 403, status
    status, _, _ = raw_get(c1, "/api/overview", {"Origin": "http://evil.example"})
    assert status == 403, status


@test(timeout=120)
def overview_shows_the_totals():
    page = dom(c1, "overview")
    assert 'id="login"' in page and refreshes(page) >= 2, "the page did not refresh: %s" % (
        page[-1500:])
    overview = c1.api_get("/api/overview")
    assert text_of(page, "ov-queues") == str(len(QUEUES)) == str(overview["queues"]), (
        text_of(page, "ov-queues"), overview["queues"])
    assert text_of(page, "ov-connections") == str(overview["connections"])
    assert text_of(page, "ov-alarms") == "none"
    assert text_of(page, "who") == cluster.api_user[0]


@test(timeout=120)
def queue_list_shows_a_page():
    page = dom(c2, "queues")
    assert text_of(page, "list-title") == "Queues (%d)" % len(QUEUES), text_of(page, "list-title")
    for q in QUEUES:
        assert ">%s<" % q in page, "queue %s not listed" % q
    assert text_of(page, "list-page") == "page 1 of 1"


@test(timeout=120)
def login_form_then_filter_and_sort_live():
    """The login form as a person uses it (no fragment): a wrong password
    is refused by the API and said so, the right one opens the queues;
    then the filter box and a click on a column head ask for another page."""
    url = "http://%s:%d/#queues" % (c2.host, c2.http_port)
    page = ConsolePage(url)
    try:
        ev = page.evaluate
        login_shown = "document.getElementById('login')?.hidden === false"  # once loaded
        wait_until(lambda: ev(login_shown), 20, interval=0.2, what="the login form")
        user, password = cluster.api_user

        def log_in(pw):
            ev("document.getElementById('login-user').value = %s;"
               "document.getElementById('login-password').value = %s;"
               "document.getElementById('login').requestSubmit(); true"
               % (json.dumps(user), json.dumps(pw)))
        log_in(password + "-wrong")
        wait_until(lambda: ev("document.getElementById('login-error').textContent"), 10,
                   interval=0.2, what="the login error")
        assert ev("document.getElementById('login-error').textContent").startswith(
            "Login failed"), ev("document.getElementById('login-error').textContent")
        assert ev("document.getElementById('view-list').hidden")
        log_in(password)
        title = "document.getElementById('list-title').textContent"
        wait_until(lambda: ev(title) == "Queues (%d)" % len(QUEUES), 10, interval=0.2,
                   what="the queue list", detail=lambda: ev(title))
        filter_by = ("{const f = document.getElementById('list-filter'); f.value = %s;"
                     "f.dispatchEvent(new Event('input')); true}")
        ev(filter_by % "'q-7'")
        wait_until(lambda: ev(title) == "Queues (1 of %d)" % len(QUEUES), 10, interval=0.2,
                   what="the filtered list", detail=lambda: ev(title))
        names = ("[...document.querySelectorAll('#list tbody tr')]"
                 ".map((tr) => tr.children[1].textContent)")
        assert ev(names) == ["console-q-7"], ev(names)
        ev(filter_by % "''")
        wait_until(lambda: ev(names) == sorted(QUEUES), 10, interval=0.2,
                   what="the whole list by name", detail=lambda: ev(names))
        ev("document.querySelector('#list th[data-key=name]').click(); true")
        wait_until(lambda: ev(names) == sorted(QUEUES, reverse=True), 10, interval=0.2,
                   what="the list by name, descending", detail=lambda: ev(names))
        # The credentials are the tab's, not the address's.
        assert "password" not in ev("location.href"), ev("location.href")
    finally:
        page.close()


@test(timeout=120)
def a_list_that_shrinks_under_its_page_starts_again():
    """On the last of three pages of 20, the list loses 55 of its 60 rows:
    the page shown is past the end now (the API refuses it, 400
    page_out_of_range, as RabbitMQ), and the console goes back to page 1
    by itself, with what is left."""
    page = ConsolePage(page_url(c2, "queues"))
    conn = connect(c2)
    ch = conn.channel()
    names = ["shrink-%02d" % i for i in range(60)]
    try:
        for n in names:
            ch.queue_declare(n)
        ev = page.evaluate
        title = "document.getElementById('list-title').textContent"
        at = "document.getElementById('list-page').textContent"
        wait_until(lambda: ev("!!document.getElementById('list-filter')") and
                   ev(title).startswith("Queues"), 20, interval=0.2, what="the queue list")
        ev("{const s = document.getElementById('list-page-size'); s.value = '20';"
           "s.dispatchEvent(new Event('change'));"
           "const f = document.getElementById('list-filter'); f.value = 'shrink-';"
           "f.dispatchEvent(new Event('input')); true}")
        wait_until(lambda: ev(at) == "page 1 of 3", 10, interval=0.2, what="three pages",
                   detail=lambda: ev(at))
        for want in ("page 2 of 3", "page 3 of 3"):
            ev("document.getElementById('list-next').click(); true")
            wait_until(lambda: ev(at) == want, 10, interval=0.2, what=want,
                       detail=lambda: ev(at))
        for n in names[5:]:
            ch.queue_delete(n)
        wait_until(lambda: ev(at) == "page 1 of 1", 20, interval=0.2, what="back to page 1",
                   detail=lambda: (ev(at), ev(title)))
        rows = ("[...document.querySelectorAll('#list tbody tr')]"
                ".map((tr) => tr.children[1].textContent)")
        wait_until(lambda: ev(rows) == names[:5], 10, interval=0.2, what="the five left",
                   detail=lambda: ev(rows))
    finally:
        for n in names:
            ch.queue_delete(n)
        conn.close()
        page.close()


@test(timeout=120)
def the_other_lists_show_what_the_api_says():
    """Exchanges, users, policies and connections: each view's title counts
    what the API lists, and a row this test knows of is drawn."""
    status, body = c1.api_call("PUT", "/api/policies/%2F/console-p",
                               {"pattern": "^console-", "priority": 0, "backups": 1})
    assert status in (201, 204), (status, body)
    conn = connect(c2)  # a client of c2, listed there
    try:
        wait_until(lambda: any(p["name"] == "console-p" for p in c2.api_get("/api/policies")),
                   10, what="the policy on c2")
        for view, path, row in (("exchanges", "/api/exchanges", "amq.topic"),
                                ("users", "/api/users", cluster.api_user[0]),
                                ("policies", "/api/policies", "console-p"),
                                ("connections", "/api/connections", None)):
            want = len(c2.api_get(path))
            page = dom(c2, view)
            title = text_of(page, "list-title")
            assert title == "%s (%d)" % (view.capitalize(), want), (view, title, want)
            assert row is None or ">%s<" % row in page, (view, row)
    finally:
        conn.close()
        c1.api_call("DELETE", "/api/policies/%2F/console-p")


@test(timeout=120)
def cluster_map_draws_the_brokers():
    page = dom(c1, "cluster")
    drawn = brokers_drawn(page)
    api = {b["name"]: b for b in c1.api_get("/api/cluster")["brokers"]}
    assert set(drawn) == {"c1", "c2", "c3"}, drawn
    for name, b in drawn.items():
        assert b["state"] == "up", drawn
        assert (b["primaries"], b["backups"]) == (api[name]["primaries"], api[name]["backups"]), (
            drawn, api)
    assert sum(b["primaries"] for b in drawn.values()) == len(QUEUES)
    pairs = re.findall(r'<g class="pair-group" data-primary="([^"]+)" data-backup="([^"]+)" '
                       r'data-queues="(\d+)"', page)
    assert sum(int(n) for _, _, n in pairs) == len(QUEUES), pairs
    screenshot(c1, "cluster", "cluster-up.png")


@test(timeout=120)
def one_queues_placement():
    q = c1.api_get("/api/queues/%2F/" + QUEUES[3])
    page = dom(c1, "cluster&queue=" + QUEUES[3])
    shown = text_of(page, "cl-queue") if 'id="cl-queue"><p' not in page else re.search(
        r'id="cl-queue"><p>([^<]*)<', page).group(1)
    assert "primary %s" % q["primary"] in shown, (shown, q)
    assert "backups %s" % ", ".join(q["backups"]) in shown, (shown, q)


def fill(member, queue, total, size=4096):
    conn = connect(member)
    ch = conn.channel()
    ch.confirm_delivery()
    pad = b"x" * size
    for i in range(total // size):
        ch.basic_publish("", queue, pad, pika.BasicProperties(delivery_mode=2))
    conn.close()


@test(timeout=180)
def a_move_is_drawn_while_it_runs():
    """POST /api/cluster/move of a queue of MOVE_BYTES to the broker that is
    not its backup: the target is caught up at CATCH_UP_RATE (~12 s), and
    while it is, the open page draws the move (its arrow on the ring, its row
    in the moves table, "move started" in the recent events); when the
    handover is done, the events list it (primary moved, reason move) and
    the arrow is gone."""
    q = declare_until("console-mv", c1, lambda i: i is not None and len(i["backups"]) == 1,
                      **{"x-quay-backups": 1})
    fill(c1, q, MOVE_BYTES)
    wait_until(lambda: queue_info(c1, q)["in_sync"] == queue_info(c1, q)["backups"], 60,
               what="its backup in sync")
    info = queue_info(c1, q)
    source, target = info["primary"], next(
        n for n in ("c1", "c2", "c3") if n not in (info["primary"], info["backups"][0]))
    page = ConsolePage(page_url(c1, "cluster"))
    try:
        wait_until(lambda: len(page.brokers()) == 3, 20, interval=0.2, what="the ring")
        status, body = c1.api_call("POST", "/api/cluster/move", json.dumps(
            {"vhost": "/", "queue": q, "to": target}).encode(), timeout=5)
        assert status == 202, (status, body)
        t0 = time.monotonic()
        arrow = "#ring path.move[data-queue='%s']" % q
        wait_until(lambda: page.data(arrow), 10, interval=0.1, what="the move's arrow",
                   detail=lambda: (page.data("#ring path.move"), queue_info(c1, q)))
        rows = ("[...document.querySelectorAll('#cl-moves tbody tr')]"
                ".map((tr) => [...tr.children].map((td) => td.textContent))")
        row = [r for r in page.evaluate(rows) if r[0] == "%s (/)" % q]
        assert row and row[0][2:4] == [source, target], page.evaluate(rows)
        wait_until(lambda: page.events(event="move_started", queue=q, to=target, reason="move"),
                   5, interval=0.1, what="move started listed", detail=lambda: page.events())
        # Still in progress when the page drew it (not a move done already).
        assert queue_info(c1, q)["primary"] == source, queue_info(c1, q)
        print("# the move's arrow and row drawn %.1f s after the POST, while in progress"
              % (time.monotonic() - t0))
        screenshot_live(page, "cluster-move.png")
        wait_until(lambda: queue_info(c1, q)["primary"] == target, 60, what="the move done")
        wait_until(lambda: page.events(event="primary_moved", queue=q, reason="move",
                                       to=target), 10, interval=0.2,
                   what="the handover listed", detail=lambda: page.events())
        wait_until(lambda: not page.data(arrow), 10, interval=0.2, what="the arrow gone")
    finally:
        page.close()


@test(timeout=180)
def a_backup_catching_up_is_drawn_so():
    """A backup held back: a policy gives a full queue a second backup, caught
    up at CATCH_UP_RATE; until it is in sync, the ring's arrow from the
    queue's primary to it says so (fewer in sync than queues, orange
    "catching-up"), and green again once it is."""
    # (No x-quay-backups: the argument would win over the policy.)
    q = declare_until("console-lag", c1, lambda i: i is not None and len(i["backups"]) == 1)
    fill(c1, q, MOVE_BYTES)
    wait_until(lambda: queue_info(c1, q)["in_sync"] == queue_info(c1, q)["backups"], 60,
               what="its backup in sync")
    info = queue_info(c1, q)
    primary = info["primary"]
    added = next(n for n in ("c1", "c2", "c3") if n not in (primary, info["backups"][0]))
    page = ConsolePage(page_url(c1, "cluster"))
    pair = "#ring g.pair-group[data-primary=%s][data-backup=%s]" % (primary, added)
    try:
        wait_until(lambda: len(page.brokers()) == 3, 20, interval=0.2, what="the ring")
        status, body = c1.api_call("PUT", "/api/policies/%2F/console-lag",
                                   {"pattern": "^%s$" % q, "priority": 5, "backups": 2})
        assert status in (201, 204), (status, body)

        def behind():
            drawn = page.data(pair)
            return drawn if drawn and int(drawn[0]["inSync"]) < int(drawn[0]["queues"]) else None
        drawn = wait_until(behind, 15, interval=0.1, what="the new backup drawn catching up",
                           detail=lambda: (page.data("#ring g.pair-group"), queue_info(c1, q)))
        assert added in queue_info(c1, q)["backups"], queue_info(c1, q)
        kinds = page.evaluate("[...document.querySelectorAll(%s)].map((p) => p.getAttribute("
                              "'class'))" % json.dumps(pair + " path"))
        assert kinds and all("catching-up" in k for k in kinds), kinds
        print("# drawn catching up: %s" % drawn)
        screenshot_live(page, "cluster-catching-up.png")
        wait_until(lambda: added in queue_info(c1, q)["in_sync"], 60, what="in sync at last")
        wait_until(lambda: (page.data(pair) or [{}])[0].get("inSync") ==
                   (page.data(pair) or [{}])[0].get("queues"), 10, interval=0.2,
                   what="the pair drawn in sync", detail=lambda: page.data(pair))
    finally:
        page.close()
        c1.api_call("DELETE", "/api/policies/%2F/console-lag")


@test(timeout=120)
def overview_rates_under_load():
    """A publisher on c1 for a few seconds: the open overview shows a
    publish rate above 0 (from successive totals of /api/overview)."""
    conn = connect(c1)
    ch = conn.channel()
    ch.queue_declare("console-rate")
    conn.close()
    page = ConsolePage(page_url(c1, "overview"))
    stop = threading.Event()

    def publish():
        c = connect(c1)
        pch = c.channel()
        while not stop.is_set():
            pch.basic_publish("", "console-rate", b"r" * 100)
            time.sleep(0.002)
        c.close()
    worker = threading.Thread(target=publish)
    try:
        wait_until(lambda: page.text("ov-queues") not in (None, "", "-"), 20, interval=0.2,
                   what="the overview")
        worker.start()

        def rate():
            text = page.text("ov-rate-publish")
            return text if text not in (None, "", "-") and float(text.replace(",", "")) > 0 else None
        got = wait_until(rate, 15, interval=0.2, what="a publish rate above 0",
                         detail=lambda: page.text("ov-rate-publish"))
        print("# overview publish rate under load: %s/s" % got)
    finally:
        stop.set()
        if worker.is_alive():
            worker.join(10)
        page.close()
        conn = connect(c1)
        conn.channel().queue_delete("console-rate")
        conn.close()


def screenshot_live(page, name):
    """A screenshot of the open page (DevTools' Page.captureScreenshot)."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = page.call("Page.captureScreenshot", {"format": "png"}, page.session)
    path = os.path.join(ARTIFACTS, name)
    with open(path, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    print("# screenshot: %s" % path)


@test(timeout=240)
def a_killed_broker_is_drawn_down_live():
    """c3 killed with -9 while the cluster map is open: the page draws it
    down, and lists the failover as it happens: c3 down with its reason,
    and each queue whose primary was c3 moved to the broker that took it
    (reason failover), drawn as a red arrow from c3 for 30 s."""
    # A queue c3 is the primary of, with an in-sync backup to fail over to.
    declare_until("console-fo", c1, lambda i: i is not None and i["primary"] == "c3" and
                  len(i["backups"]) == 1, **{"x-quay-backups": 1})
    on_c3 = wait_until(lambda: (lambda qs: qs if all(q["in_sync"] == q["backups"] for q in qs)
                                else None)([q for q in c1.api_get("/api/queues")
                                            if q["primary"] == "c3" and q["backups"]]),
                       90, interval=0.2, what="c3's queues' backups in sync")
    page = ConsolePage(page_url(c1, "cluster"))
    try:
        wait_until(lambda: page.brokers() == {"c1": "up", "c2": "up", "c3": "up"}, 20,
                   interval=0.2, what="the open page to draw three brokers up",
                   detail=lambda: page.brokers())
        t0 = c3.kill()
        # The page is not reloaded: its own refresh (every 1.5 s) redraws c3.
        wait_until(lambda: page.brokers().get("c3") == "down", 10,
                   interval=0.2, what="the open page to draw c3 down", detail=lambda: page.brokers())
        print("# the open page drew c3 down %.1f s after kill -9" % (time.monotonic() - t0))
        assert page.brokers() == {"c1": "up", "c2": "up", "c3": "down"}, page.brokers()
        api = {b["name"]: b["state"] for b in c1.api_get("/api/cluster")["brokers"]}
        assert api["c3"] == "down", api
        # The failovers, listed as they happened (the page still not reloaded).
        names = sorted(q["name"] for q in on_c3)
        def failed_over():
            got = sorted(e["queue"] for e in page.events(event="primary_moved", reason="failover",
                                                          **{"from": "c3"}))
            return got if got == names else None
        wait_until(failed_over, 10, interval=0.2, what="the page to list c3's failovers",
                   detail=lambda: page.events())
        print("# the open page listed %d failover(s) from c3 %.1f s after kill -9"
              % (len(names), time.monotonic() - t0))
        now = {q["name"]: q["primary"] for q in c1.api_get("/api/queues")}
        for e in page.events(event="primary_moved", reason="failover", **{"from": "c3"}):
            assert e["to"] == now[e["queue"]] and "failover" in e["class"].split(), (e, now)
            assert "recent" in e["class"].split(), e
        down = page.events(event="broker_state", broker="c3", to="down")
        assert len(down) == 1 and down[0]["reason"] in ("connection_reset",
                                                        "heartbeats_missed"), down
        # On the ring: a red arrow from c3 to each broker that took queues,
        # c3 marked as the broker that failed.
        arrows = {a["to"]: int(a["queues"]) for a in page.data("#ring g.failover-group")
                  if a["from"] == "c3"}
        want = {}
        for q in on_c3:
            want[now[q["name"]]] = want.get(now[q["name"]], 0) + 1
        assert arrows == want, (arrows, want)
        c3_drawn = page.data("#ring g.broker[data-name=c3]")
        assert "failed" in c3_drawn[0]["class"].split(), c3_drawn
        screenshot_live(page, "cluster-c3-failover-live.png")
    finally:
        page.close()


@test(timeout=120)
def a_fresh_page_draws_it_down():
    page = dom(c1, "cluster")
    drawn = brokers_drawn(page)
    assert drawn["c3"]["state"] == "down", drawn
    assert drawn["c1"]["state"] == "up" and drawn["c2"]["state"] == "up", drawn
    screenshot(c1, "cluster", "cluster-c3-down.png")

if __name__ == "__main__":
    if CHROMIUM is None:
        print("# skipped: no chromium (scripts/setup.sh installs it)")
        sys.exit(77)
    sys.exit(run(cleanup=closer(lambda: cluster)))
