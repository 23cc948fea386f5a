#!/usr/bin/env bash
# bench/cluster.sh -- quay clusters on this machine (issue 5's rows).
#
#   proxy   3 brokers a, b, c. One queue whose primary is a. 1 KiB messages, confirms,
#           prefetch 100 (the reference row's settings): first published and consumed on a
#           ("local"), then published via b and consumed via c ("proxied"). Interleaved REPS
#           times; prints medians and proxied/local.
#   failover 3 brokers, FAILOVER_QUEUES queues (one backup each, the default) declared through
#           broker 1; kill -9 of broker 2 (a follower) and, in a second round, of the leader;
#           reports how long until no queue has the dead broker as primary (all promoted),
#           and what a channel opened before the kill on the watching broker saw while it
#           published with confirms to one of the dead broker's queues (nacks, errors, the
#           longest wait for a confirm).
#   scale   5 brokers; quayscale declares SCALE_QUEUES queues (one binding each) through
#           broker 2; reports declares/s, the map's size, each broker's RSS, then the time a
#           6th broker takes from start to "caught up with the map" (it has every definition).
#   cut     3 brokers, each a host in a network namespace (tests/cluster/netlab.py; needs
#           root); a queue with x-quay-backups=2 whose primary is b1; amqpbench
#           --failover-probe publishing via b2 (then b3); 4 s in, b1 is silently cut from b2
#           and b3 (nftables drops between the hosts; no resets). Prints the longest confirm
#           gap, nacked, lost, dup, and when b2's map promoted another primary. Target: gap
#           <= 2 s. (bench/cluster_probe.py does the work.)
#   kill9   the same with kill -9 of b1 instead of the cut, for comparison.
#           PROBE_VICTIM=b3: the primary is a follower, not the Raft leader b1.
#
#   replicated 3 brokers; a queue with x-quay-backups=2 (transient, then durable with
#           persistent messages); amqpbench with confirms on its primary (see row_replicated).
#   heal    5 brokers in network namespaces (needs root); HEAL_REPS times: the Raft leader and
#           one other broker are cut off, the majority declares HEAL_DECLARES queues, the
#           partition heals; reports how long until every broker has the same map, and whether
#           the cut-off brokers needed a snapshot (bench/cluster_heal.py does the work).
#
#   forget  5 brokers, FORGET_QUEUES queues (one backup each) declared through broker 2, a
#           tenth as many more with x-quay-backups=0; kill -9 of broker 5, then (once failed
#           over) POST /api/cluster/forget {"broker": "b5"} on broker 1: reports what was
#           decided and how long until b5 is out of every map, every queue is available with
#           its backups again, and b1's Raft has 3 followers.
#   move    3 brokers; a durable queue (one backup, b2) whose primary is b1, filled with
#           MOVE_MESSAGES persistent 1 KiB messages; quaybench publishes MOVE_RATE msg/s with
#           confirms via b2 and consumes (prefetch 100) via b3 at MOVE_CONSUMER_RATE msg/s (so
#           the queue still holds its backlog when it moves; 0: as fast as it can, which
#           drains the backlog in the first second) for DURATION s; MOVE_AT (1) s in,
#           POST /api/cluster/move hands the queue to b3 (not its backup: it catches up
#           first). Reports how long the move took (catching up, then the switch), the
#           longest publish-to-confirm wait, lost, dup, reordered, nacked (target: 0, 0, 0,
#           0 and a confirm wait <= 50 ms). The prefilled messages count as foreign. MOVE=0:
#           the same without the move (the confirm waits the load alone causes).
#           MOVE_CONSUMERS=0: no consumer, so the confirm waits show what the catch-up
#           alone costs the publisher (lost then counts the messages nobody consumed).
#           MOVE_TO=b2: the move goes to the queue's backup instead (the old primary stays
#           its backup, in sync: no catch-up at all). MOVE_BACKUP_OF=b2: b3 takes b2's
#           place as the queue's backup (it catches up; the primary stays on b1).
#           MOVE_IDLE_QUEUES=N: N idle queues with a backup beside it (quayscale).
#   drain   3 brokers, DRAIN_QUEUES queues (one backup each) declared through b1 (b3 is
#           primary of a third); quaybench publishes DRAIN_RATE msg/s with confirms to 4 more
#           queues via b1 and consumes them via b2; 2 s in, POST /api/cluster/drain b3.
#           Reports how long until b3 is primary and backup of nothing, how many queues lack
#           an in-sync backup after, and lost, dup, reordered, nacked.
#   join    5 brokers (automatic rebalancing, the default), JOIN_QUEUES queues (one backup
#           each) declared through b1, each holding one persistent message; quaybench
#           publishes JOIN_RATE msg/s with confirms to 4 more queues via b1 and consumes them
#           via b2; 2 s in, a 6th broker joins. Reports how long until it holds its share
#           (within 10%) of primaries and backups with no move in progress, how many
#           primaries and backups moved (ideal: its share, 1/6), whether every queue still
#           holds its message, and lost, dup, reordered, nacked.
#   takeover 3 brokers on one --shared-storage directory; TAKEOVER_QUEUES durable queues
#           without backups whose primary is b3, filled through b3 with TAKEOVER_MESSAGES
#           persistent 1 KiB messages in all (quayscale fill, confirmed); kill -9 of b3.
#           Reports when b1's map had every queue on a live broker (mapped_s) and when every
#           queue answered a passive queue.declare through b1 with all its messages
#           (serving_s), both from the kill; then reads one queue back in full.
#           TAKEOVER_PERF=PREFIX also records the takers (b1, b2) with perf record -g for
#           the 10 s after the kill (PREFIX.b1, PREFIX.b2; perf report -i ...).
#           TAKEOVER_SYSCALLS=1 counts the takers' fsync, fdatasync and rename calls (perf
#           stat) for TAKEOVER_SYSCALLS_S (20) s from the kill (a SYSCALLS line).
#   sharedha 3 brokers on one --shared-storage directory; three durable queues whose
#           primary is b1: "ha-all" (one backup, b2: every message replicated),
#           "ha-transient" (one backup, b2, x-quay-replicate: transient: it gets the
#           transient messages only, the persistent ones are in b1's log) and "ha-none" (no
#           backup: a takeover from the log alone). amqpbench on b1, persistent 1 KiB
#           messages, confirms (window 1000), prefetch 100, --check, REPS runs of DURATION s
#           per queue, interleaved. Prints published msg/s (medians) and the bytes b1 and b2
#           exchanged on their links per published message (b1's and b2's
#           quay_cluster_link_*_bytes_total, both directions, over the run). Then the queues
#           SHAREDHA_FILL names (default ha-all ha-transient) are filled with
#           SHAREDHA_MESSAGES persistent messages each and b1 is killed: how long until ha-all
#           and ha-transient answer a passive declare through b3 with their counts again.
#   fanout  3 brokers; 1 KiB messages published via b to a fanout exchange bound to 10
#           queues whose primary is a: the bytes b's link to a carries per message
#           (target: at most 1.2 KiB; bench/cluster_fanout.py does the work).
#
# Usage: bench/cluster.sh [proxy] [failover] [scale] [replicated] [cut] [kill9] [heal] [fanout]
#        [forget] [move] [drain] [join] [takeover] [sharedha]
#        (default: proxy failover scale; cut, kill9 and heal need root)
# Environment: QUAYD=build/quayd REPS=3 DURATION=10 SCALE_QUEUES=10000 BASE_PORT=6100
#              BENCH_OUT=build/bench KEEP_TMP=0 PROBE_REPS=1 PROBE_DURATION=10 PROBE_AT=4
#              AMQPBENCH=$BENCH_OUT/amqpbench SHARED_BENCH=../shared/bench
#              HEAL_REPS=5 HEAL_DECLARES=1100 HEAL_TAIL=100
#              QUAYD_ARGS= (more quayd options for every broker, e.g. --catch-up-rate 50MB)
# Needs: bench/quaybench and bench/quayscale (built here with cc, like bench/run.sh), curl,
# /usr/bin/python3 with pika (scripts/setup.sh installs both); for cut/kill9 amqpbench
# (built here from SHARED_BENCH if missing), iproute2 and nft.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
QUAYD=${QUAYD:-build/quayd}
REPS=${REPS:-3}
DURATION=${DURATION:-10}
SCALE_QUEUES=${SCALE_QUEUES:-10000}
FAILOVER_QUEUES=${FAILOVER_QUEUES:-15000}
FORGET_QUEUES=${FORGET_QUEUES:-5000}
MOVE_MESSAGES=${MOVE_MESSAGES:-100000}
MOVE_RATE=${MOVE_RATE:-5000}
MOVE_AT=${MOVE_AT:-1}
MOVE_CONSUMER_RATE=${MOVE_CONSUMER_RATE:-6000}
DRAIN_QUEUES=${DRAIN_QUEUES:-6000}
DRAIN_RATE=${DRAIN_RATE:-2000}
JOIN_QUEUES=${JOIN_QUEUES:-10000}
JOIN_RATE=${JOIN_RATE:-2000}
TAKEOVER_QUEUES=${TAKEOVER_QUEUES:-1000}
TAKEOVER_MESSAGES=${TAKEOVER_MESSAGES:-1000000}
SHAREDHA_MESSAGES=${SHAREDHA_MESSAGES:-100000}
SHAREDHA_FILL=${SHAREDHA_FILL:-ha-all ha-transient}
BASE_PORT=${BASE_PORT:-6100}
BENCH_OUT=${BENCH_OUT:-build/bench}
KEEP_TMP=${KEEP_TMP:-0}
ROWS=${*:-proxy failover scale}
PROBE_REPS=${PROBE_REPS:-1}
SHARED_BENCH=${SHARED_BENCH:-$ROOT/../shared/bench}
AMQPBENCH=${AMQPBENCH:-$BENCH_OUT/amqpbench}

mkdir -p "$BENCH_OUT"
LIBS=$(pkg-config --cflags --libs librabbitmq)
for tool in quaybench quayscale; do
  if [ ! -x "$BENCH_OUT/$tool" ] || [ "bench/$tool.c" -nt "$BENCH_OUT/$tool" ]; then
    cc -O2 -std=c17 -Wall -Wextra -o "$BENCH_OUT/$tool" "bench/$tool.c" $LIBS -lpthread -lm
  fi
done

TMP=$(mktemp -d /tmp/quay-cluster-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$KEEP_TMP" = 1 ]; then echo "# kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$TMP/secret"

amqp_port() { echo $((BASE_PORT + $1)); }
cluster_port() { echo $((BASE_PORT + 20 + $1)); }
http_port() { echo $((BASE_PORT + 40 + $1)); }

# start N [JOIN_INDEX]: broker N (1-based), joining broker JOIN_INDEX's cluster port.
start() {
  local n=$1 join=${2:-}
  local args=(--name "b$n" --listen "127.0.0.1:$(amqp_port "$n")" --data "$TMP/b$n"
              --cluster-listen "127.0.0.1:$(cluster_port "$n")" --cluster-secret-file "$TMP/secret"
              --http "127.0.0.1:$(http_port "$n")" --log-level info)
  [ -n "$join" ] && args+=(--join "127.0.0.1:$(cluster_port "$join")")
  # shellcheck disable=SC2206 # QUAYD_ARGS: extra options, split on spaces
  args+=(${QUAYD_ARGS:-})
  "$QUAYD" "${args[@]}" > "$TMP/b$n.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$n=$!"
}

# up_count N: how many brokers broker N's map has up.
up_count() {
  curl -s -u guest:guest "http://127.0.0.1:$(http_port "$1")/api/cluster" |
    /usr/bin/python3 -c 'import json,sys; print(sum(b["state"]=="up" for b in json.load(sys.stdin)["brokers"]))' 2>/dev/null || echo 0
}

wait_up() { # wait_up BROKER COUNT
  for _ in $(seq 1 300); do
    [ "$(up_count "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "broker $1 never saw $2 brokers up" >&2; exit 1
}

form() { # form N: brokers 1..N, all up in broker 1's map
  start 1; wait_up 1 1
  for n in $(seq 2 "$1"); do start "$n" 1; done
  wait_up 1 "$1"
  for n in $(seq 2 "$1"); do wait_up "$n" "$1"; done
}

stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
  [ "$KEEP_TMP" = 1 ] || rm -rf "$TMP"/b[0-9]*  # KEEP_TMP=1 keeps the logs
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

row_proxy() {
  form 3
  # A queue prefix whose "<prefix>-0" lands on broker 1 when declared through broker 2.
  local prefix
  prefix=$(/usr/bin/python3 - "$(amqp_port 2)" "$(http_port 2)" <<'EOF'
import json, sys, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
import pika
port, http = int(sys.argv[1]), int(sys.argv[2])
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
ch = c.channel()
for i in range(200):
    name = "proxybench%d-0" % i
    ch.queue_declare(name)
    qs = json.load(urllib.request.urlopen("http://127.0.0.1:%d/api/queues" % http))
    primary = [q["primary"] for q in qs if q["name"] == name][0]
    ch.queue_delete(name)
    if primary == "b1":
        print("proxybench%d" % i)
        break
c.close()
EOF
)
  [ -n "$prefix" ] || { echo "no queue name placed on b1" >&2; exit 1; }
  local common=(-P 1 -C 1 -s 1024 --confirm --prefetch 100 -d "$DURATION" --prefix "$prefix")
  local local_rates=() proxy_rates=() proxy_cpu=()
  for rep in $(seq 1 "$REPS"); do
    local r
    r=$("$BENCH_OUT/quaybench" -H 127.0.0.1 -p "$(amqp_port 1)" --consumer-port "$(amqp_port 1)" \
        "${common[@]}" | grep '^RESULT')
    local_rates+=("$(echo "$r" | field cons_rate)")
    # (The primary's CPU per message: what the forwarding path costs it.)
    r=$("$BENCH_OUT/quaybench" -H 127.0.0.1 -p "$(amqp_port 2)" --consumer-port "$(amqp_port 3)" \
        --watch-pid "$PID_1" "${common[@]}" | grep '^RESULT')
    proxy_rates+=("$(echo "$r" | field cons_rate)")
    proxy_cpu+=("$(echo "$r" | field srv_cpu_us_per_msg)")
    echo "# rep $rep: local ${local_rates[-1]} msg/s, via b2 -> b1 -> b3 ${proxy_rates[-1]} msg/s"
    echo "#   $r"
  done
  local lm pm
  lm=$(printf '%s\n' "${local_rates[@]}" | median)
  pm=$(printf '%s\n' "${proxy_rates[@]}" | median)
  echo "ROW proxy local=$lm proxied=$pm ratio=$(awk -v a="$pm" -v b="$lm" 'BEGIN{printf "%.2f", a/b}')" \
       "primary_cpu_us_per_msg=$(printf '%s\n' "${proxy_cpu[@]}" | median)"
  stop_all
}

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

row_scale() {
  form 5
  local before=()
  for n in 1 2 3 4 5; do eval "before+=(\$(rss_kib \$PID_$n))"; done
  local r
  r=$("$BENCH_OUT/quayscale" queues -H 127.0.0.1 -p "$(amqp_port 2)" -n "$SCALE_QUEUES" --keep \
      --prefix scale | grep '^RESULT')
  echo "# $r"
  sleep 2
  local rss=""
  for n in 1 2 3 4 5; do
    eval "local p=\$PID_$n"
    rss="$rss b$n=$(( $(rss_kib "$p") / 1024 ))MiB(+$(( ($(rss_kib "$p") - ${before[$((n-1))]}) / 1024 )))"
  done
  local map
  map=$(curl -s -u guest:guest "http://127.0.0.1:$(http_port 1)/api/cluster" |
        /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print("epoch=%s map_bytes=%s queues=%s" % (d["epoch"], d.get("map_bytes"), d.get("queues")))')
  local t0 t1
  t0=$(date +%s.%N)
  start 6 1
  for _ in $(seq 1 600); do
    grep -q "caught up with the map" "$TMP/b6.log" && break
    sleep 0.05
  done
  t1=$(date +%s.%N)
  grep -q "caught up with the map" "$TMP/b6.log" || { echo "b6 never caught up" >&2; exit 1; }
  sleep 1
  echo "ROW scale brokers=5 queues=$SCALE_QUEUES declares_per_s=$(echo "$r" | field declares_per_s) $map" \
       "join_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')" \
       "rss:$rss b6=$(( $(rss_kib "$PID_6") / 1024 ))MiB"
  stop_all
}

# promoted_after BROKER_INDEX WATCH_INDEX: kill -9 broker I, print seconds until broker W's
# /api/cluster shows none of I's queues served by it any more (promoted, or unavailable).
promoted_after() {
  local victim=$1 watch=$2
  /usr/bin/python3 - "b$victim" "$(http_port "$watch")" "$(eval echo \$PID_$victim)" \
      "$(amqp_port "$watch")" "b$watch" <<'EOF2'
import json, os, signal, sys, threading, time, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
import pika
victim, port, pid, amqp, watcher = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                    int(sys.argv[4]), sys.argv[5])
def queues():
    return json.load(urllib.request.urlopen("http://127.0.0.1:%d/api/queues" % port, timeout=30))
qs = queues()
owned = sum(1 for q in qs if q["primary"] == victim)
# A channel opened before the kill, on the broker we watch, publishing with
# confirms to one of the victim's queues (through its proxy) all along:
# it must see no nack and no error, only a pause.
target = next(q["name"] for q in qs if q["primary"] == victim)
chan = {"confirmed": 0, "nacked": 0, "error": "-", "gap": 0.0}
stop = threading.Event()
ready = threading.Event()
def publish():
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp, heartbeat=0))
    ch = conn.channel()
    ch.confirm_delivery()
    ready.set()
    last = time.monotonic()
    while not stop.is_set():
        try:
            ch.basic_publish("", target, b"x" * 1024)
            chan["confirmed"] += 1
        except pika.exceptions.NackError:
            chan["nacked"] += 1
        except Exception as e:  # the channel or connection noticed
            chan["error"] = type(e).__name__
            break
        now = time.monotonic()
        chan["gap"] = max(chan["gap"], now - last)
        last = now
    try:
        conn.close()
    except Exception:
        pass
publisher = threading.Thread(target=publish, daemon=True)
publisher.start()
ready.wait(10)
time.sleep(1)
t0 = time.monotonic()
os.kill(pid, signal.SIGKILL)
def share():
    # /api/cluster counts each broker's queues in one small answer: polled
    # every 10 ms it times the promotion, where /api/queues (thousands of
    # entries to write and parse) would time itself.
    c = json.load(urllib.request.urlopen("http://127.0.0.1:%d/api/cluster" % port, timeout=30))
    return next(b for b in c["brokers"] if b["name"] == victim)
while True:
    b = share()
    left = b["primaries"] - b["unavailable"]
    if not left:
        break
    if time.monotonic() - t0 > 60:
        sys.exit("not decided after 60 s: %d queues" % left)
    time.sleep(0.01)
decided = time.monotonic() - t0
unavailable = b["unavailable"]  # still the victim's: no in-sync backup to promote
time.sleep(1)
stop.set()
publisher.join(10)
print("queues=%d decided_s=%.2f promoted=%d unavailable=%d (no in-sync backup); a channel on "
      "%s: confirmed=%d nacked=%d error=%s max_confirm_gap_ms=%.0f"
      % (owned, decided, owned - unavailable, unavailable, watcher, chan["confirmed"],
         chan["nacked"], chan["error"], chan["gap"] * 1000))
EOF2
}

row_failover() {
  form 3
  "$BENCH_OUT/quayscale" queues -H 127.0.0.1 -p "$(amqp_port 1)" -n "$FAILOVER_QUEUES" --keep \
      --prefix mass > /dev/null
  echo "ROW failover follower $(promoted_after 2 1)"
  start 2 1
  wait_up 1 3
  echo "ROW failover leader $(promoted_after 1 3)"
  stop_all
}

# The shared instrument, built from SHARED_BENCH if missing.
need_amqpbench() {
  if [ ! -x "$AMQPBENCH" ]; then
    make -s -f "$SHARED_BENCH/Makefile" OUT="$(dirname "$AMQPBENCH")" "$AMQPBENCH"
  fi
}

# row_replicated: throughput of a queue with 2 backups (issue 6's row). 3 brokers; the queue
# declared through broker 1 with x-quay-backups=2 (durable for the persistent row), then,
# once both backups are in sync, amqpbench on its primary: -s 1024 --confirm -w 1000
# --prefetch 100 --check, REPS runs of DURATION s per row. Prints consumed msg/s (medians).
row_replicated() {
  need_amqpbench
  form 3
  local out="" kind
  for kind in transient persistent; do
    local q="repl-$kind" extra=() primary
    [ "$kind" = persistent ] && extra=(--persistent --durable)
    primary=$(/usr/bin/python3 - "$(amqp_port 1)" "$(http_port 1)" "$q" "$kind" <<'EOF2'
import json, sys, time, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
import pika
port, http, name, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
c.channel().queue_declare(name, durable=kind == "persistent", arguments={"x-quay-backups": 2})
c.close()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    qs = json.load(urllib.request.urlopen("http://127.0.0.1:%d/api/queues" % http))
    q = next(q for q in qs if q["name"] == name)
    if len(q["in_sync"]) == 2:
        print(q["primary"][1:])  # "b2" -> 2
        sys.exit(0)
    time.sleep(0.1)
sys.exit("%s: backups never in sync: %s" % (name, q))
EOF2
)
    local rates=()
    for rep in $(seq 1 "$REPS"); do
      local r
      r=$("$AMQPBENCH" -p "$(amqp_port "$primary")" -q "$q" --no-setup -s 1024 -d "$DURATION" \
          --confirm -w 1000 --prefetch 100 --check --keep "${extra[@]}" | grep '^RESULT')
      echo "# $kind rep $rep: $r"
      case "$r" in *" lost=0 "*) ;; *) echo "ROW replicated status=fail ($kind: lost messages)"; exit 1 ;; esac
      rates+=("$(echo "$r" | field cons_rate)")
    done
    out="$out $kind=$(printf '%s\n' "${rates[@]}" | median)"
  done
  echo "ROW replicated backups=2 size=1024 confirm window=1000 prefetch=100$out (consumed msg/s)"
  stop_all
}

# row_probe cut|kill9: the failover probe across a silent cut (or kill -9) of the primary.
row_probe() {
  need_amqpbench
  local quayd
  quayd=$(realpath "$QUAYD")
  for rep in $(seq 1 "$PROBE_REPS"); do
    QUAYD=$quayd /usr/bin/python3 "$ROOT/bench/cluster_probe.py" "$1" --amqpbench "$AMQPBENCH" |
      sed "s/^ROW $1 /ROW $1 rep=$rep /" || echo "ROW $1 rep=$rep status=fail (lost messages, or the probe failed)"
  done
}

row_fanout() {
  local quayd
  quayd=$(realpath "$QUAYD")
  QUAYD=$quayd /usr/bin/python3 "$ROOT/bench/cluster_fanout.py" ||
    echo "ROW fanout status=fail (a queue missed messages, or the script failed)"
}

row_heal() {
  local quayd
  quayd=$(realpath "$QUAYD")
  QUAYD=$quayd /usr/bin/python3 "$ROOT/bench/cluster_heal.py" ||
    echo "ROW heal status=fail (the map did not agree, or the script failed)"
}

row_move() {
  form 3
  # MOVE_IDLE_QUEUES: that many more queues with a backup, idle, beside the moved one.
  if [ "${MOVE_IDLE_QUEUES:-0}" -gt 0 ]; then
    "$BENCH_OUT/quayscale" queues -H 127.0.0.1 -p "$(amqp_port 1)" -n "$MOVE_IDLE_QUEUES" \
        --keep --prefix idle > /dev/null
  fi
  # A queue whose primary is b1 and whose backup is b2 (names are tried in turn).
  local prefix
  prefix=$(/usr/bin/python3 - "$(amqp_port 2)" "$(http_port 1)" <<'EOF'
import json, sys, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
import pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
for i in range(200):
    name = "mvb%d" % i
    ch.queue_declare(name + "-0", durable=True, arguments={"x-quay-backups": 1})
    with urllib.request.urlopen("http://127.0.0.1:%s/api/queues" % sys.argv[2]) as r:
        q = next(q for q in json.load(r) if q["name"] == name + "-0")
    if q["primary"] == "b1" and q["backups"] == ["b2"]:
        print(name)
        break
    ch.queue_delete(name + "-0")
c.close()
EOF
)
  local qb=(--prefix "$prefix" --durable --persistent --confirm --no-setup --keep
            --qarg x-quay-backups=1)
  # The backlog: 1 KiB bodies quaybench counts as foreign (no header of its own).
  /usr/bin/python3 - "$(amqp_port 2)" "$prefix-0" "$MOVE_MESSAGES" <<'EOF'
import sys
import pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
body, props = b"backlog!" * 128, pika.BasicProperties(delivery_mode=2)
for i in range(int(sys.argv[3]) - 1):
    ch.basic_publish("", sys.argv[2], body, props)
ch.confirm_delivery()
ch.basic_publish("", sys.argv[2], body, props)  # confirmed: so is everything before it
c.close()
EOF
  "$BENCH_OUT/quaybench" -H 127.0.0.1 -p "$(amqp_port 2)" --consumer-port "$(amqp_port 3)" \
      -P 1 -C "${MOVE_CONSUMERS:-1}" --prefetch 100 --rate "$MOVE_RATE" -d "$DURATION" \
      --consumer-rate "$MOVE_CONSUMER_RATE" --drain-timeout 10 ${QB_VERBOSE:+-v} "${qb[@]}" \
      > "$TMP/move.out" &  # QB_VERBOSE=1: progress and the longest confirm wait each second
  local bench=$!
  sleep "$MOVE_AT"
  [ "${MOVE:-1}" = 0 ] || /usr/bin/python3 - "$(http_port 1)" "$prefix-0" "${MOVE_TO:-b3}" \
      "${MOVE_BACKUP_OF:-}" <<'EOF'
import json, sys, time, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
port, queue = int(sys.argv[1]), sys.argv[2]
def get(path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
        return json.load(r)
t0 = time.time()
move = {"queue": queue, "to": sys.argv[3]}
if sys.argv[4]:
    move["backup_of"] = sys.argv[4]  # the backup moves; the primary stays
req = urllib.request.Request("http://127.0.0.1:%d/api/cluster/move" % port, method="POST",
                             data=json.dumps(move).encode(),
                             headers={"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=30).close()
synced = None
samples = []  # (time, bytes sent) while the primary says it catches up
while time.time() < t0 + 60:
    moves = get("/api/cluster")["moves"]  # (only the move's own queue: cheap for b1)
    now = time.time()
    if moves and "caught_up_bytes" in moves[0]:
        samples.append((now, moves[0]["caught_up_bytes"]))
    if synced is None and (not moves or moves[0]["phase"] != "catching-up"):
        synced = now - t0
    if not moves:
        break
    time.sleep(0.01)
# The catch-up's rate between the first and the last sample the primary
# gave (polls ~10 ms apart: within a few percent for a catch-up of 1 s).
rate = 0.0
if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
    rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]) / 1e6
print("MOVE caught_up_s=%.2f done_s=%.2f catch_up_MBps=%.0f catch_up_bytes=%d" % (
    synced or 0, time.time() - t0, rate, samples[-1][1] if samples else 0), flush=True)
EOF
  wait "$bench" || true
  local r
  r=$(grep RESULT "$TMP/move.out")
  echo "ROW move messages=$MOVE_MESSAGES rate=$MOVE_RATE" \
       "conf_max_ms=$(echo "$r" | field conf_max_us | awk '{print $1/1000}')" \
       "conf_p99_ms=$(echo "$r" | field conf_p99_us | awk '{print $1/1000}')" \
       "lost=$(echo "$r" | field lost) dup=$(echo "$r" | field dup)" \
       "reordered=$(echo "$r" | field reorder) nacked=$(echo "$r" | field nacked)" \
       "foreign=$(echo "$r" | field foreign) redelivered=$(echo "$r" | field redelivered)"
  grep -h "handed over" "$TMP"/b[0-9].log | sed 's/.*queue=/MOVE queue=/' || true
  stop_all
}

row_drain() {
  form 3
  "$BENCH_OUT/quayscale" queues -H 127.0.0.1 -p "$(amqp_port 1)" -n "$DRAIN_QUEUES" --keep \
      --prefix dq > /dev/null
  # Load: 4 queues, published via b1 and consumed via b2, with confirms, during the drain.
  "$BENCH_OUT/quaybench" -H 127.0.0.1 -p "$(amqp_port 1)" --consumer-port "$(amqp_port 2)" \
      -P 4 -C 4 --queues 4 --prefix dl --prefetch 100 --rate "$DRAIN_RATE" -d "$DURATION" \
      --confirm --persistent --durable --qarg x-quay-backups=1 > "$TMP/drain.out" &
  local bench=$!
  sleep 2
  /usr/bin/python3 - "$(http_port 1)" <<'EOF'
import json, sys, time, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
port = int(sys.argv[1])
def get(path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
        return json.load(r)
b3 = next(b for b in get("/api/cluster")["brokers"] if b["name"] == "b3")
t0 = time.time()
req = urllib.request.Request("http://127.0.0.1:%d/api/cluster/drain" % port, method="POST",
                             data=b'{"broker": "b3"}',
                             headers={"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=30).close()
while time.time() < t0 + 120:
    b = next(b for b in get("/api/cluster")["brokers"] if b["name"] == "b3")
    if b["primaries"] == 0 and b["backups"] == 0:
        break
    time.sleep(0.1)
short = sum(1 for q in get("/api/queues") if q["replication_factor"] > 1 and
            len(q["in_sync"]) < q["replication_factor"] - 1)
print("DRAIN b3 primaries=%d backups=%d empty_s=%.2f left=%d/%d queues_short_after=%d" % (
    b3["primaries"], b3["backups"], time.time() - t0, b["primaries"], b["backups"], short),
    flush=True)
EOF
  wait "$bench" || true
  local r
  r=$(grep RESULT "$TMP/drain.out")
  echo "ROW drain queues=$DRAIN_QUEUES rate=$DRAIN_RATE" \
       "conf_max_ms=$(echo "$r" | field conf_max_us | awk '{print $1/1000}')" \
       "lost=$(echo "$r" | field lost) dup=$(echo "$r" | field dup)" \
       "reordered=$(echo "$r" | field reorder) nacked=$(echo "$r" | field nacked)"
  stop_all
}

row_join() {
  form 5
  "$BENCH_OUT/quayscale" queues -H 127.0.0.1 -p "$(amqp_port 1)" -n "$JOIN_QUEUES" --keep \
      --prefix jq > /dev/null
  /usr/bin/python3 - "$(amqp_port 1)" "$JOIN_QUEUES" <<'EOF'
import sys
import pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
ch.confirm_delivery()
for i in range(int(sys.argv[2])):
    ch.basic_publish("", "jq-%d" % i, b"m", pika.BasicProperties(delivery_mode=2))
c.close()
EOF
  "$BENCH_OUT/quaybench" -H 127.0.0.1 -p "$(amqp_port 1)" --consumer-port "$(amqp_port 2)" \
      -P 4 -C 4 --queues 4 --prefix jl --prefetch 100 --rate "$JOIN_RATE" -d "$DURATION" \
      --confirm --persistent --durable --qarg x-quay-backups=1 > "$TMP/join.out" &
  local bench=$!
  sleep 2
  local before="$TMP/join.before"
  curl -s -u guest:guest "http://127.0.0.1:$(http_port 1)/api/queues" > "$before"
  local t0
  t0=$(date +%s.%N)
  start 6 1
  /usr/bin/python3 - "$(http_port 1)" "$before" "$t0" "$(http_port 2)" "$(http_port 3)" \
      "$(http_port 4)" "$(http_port 5)" "$(http_port 6)" <<'EOF'
import json, math, sys, time, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
port, t0 = int(sys.argv[1]), float(sys.argv[3])
before = {q["name"]: (q["primary"], tuple(sorted(q["backups"])))
          for q in json.load(open(sys.argv[2])) if q["name"].startswith("jq-")}
def get(path, at=port):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (at, path), timeout=30) as r:
        return json.load(r)
n = len(before)
lo, hi = math.floor(n / 6 * 0.9), math.ceil(n / 6 * 1.1)
ok = False
b6 = None
while time.time() < t0 + 180:
    info = get("/api/cluster")
    b6 = next((b for b in info["brokers"] if b["name"] == "b6"), None)
    if b6 and not info["moves"] and lo <= b6["primaries"] <= hi and lo <= b6["backups"] <= hi:
        ok = True
        break
    time.sleep(0.2)
took = time.time() - t0
qs = {q["name"]: q for q in get("/api/queues") if q["name"].startswith("jq-")}
pm = sum(1 for k, v in before.items() if qs[k]["primary"] != v[0])
bm = sum(len(set(qs[k]["backups"]) - set(v[1])) for k, v in before.items())
# A queue's messages as its primary counts them.
held = {q["name"]: q["messages_ready"] for p in [port] + [int(x) for x in sys.argv[4:]]
        for q in get("/api/queues", p) if q["role"] == "primary" and q["name"] in qs}
empty = sum(1 for k in qs if held.get(k) != 1)
print("JOIN b6 primaries=%d backups=%d share=[%d,%d] took_s=%.1f primary_moves=%d "
      "backup_moves=%d queues_missing_their_message=%d status=%s" % (
          b6["primaries"] if b6 else -1, b6["backups"] if b6 else -1, lo, hi, took, pm, bm,
          empty, "ok" if ok else "fail"), flush=True)
EOF
  wait "$bench" || true
  local r
  r=$(grep RESULT "$TMP/join.out")
  echo "ROW join queues=$JOIN_QUEUES rate=$JOIN_RATE" \
       "conf_max_ms=$(echo "$r" | field conf_max_us | awk '{print $1/1000}')" \
       "lost=$(echo "$r" | field lost) dup=$(echo "$r" | field dup)" \
       "reordered=$(echo "$r" | field reorder) nacked=$(echo "$r" | field nacked)"
  stop_all
}

row_forget() {
  form 5
  "$BENCH_OUT/quayscale" queues -H 127.0.0.1 -p "$(amqp_port 2)" -n "$FORGET_QUEUES" --keep \
      --prefix fq > /dev/null
  /usr/bin/python3 - "$(amqp_port 2)" "$((FORGET_QUEUES / 10))" <<'EOF'
import sys
import pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
for i in range(int(sys.argv[2])):
    ch.queue_declare("fq-lone-%d" % i, arguments={"x-quay-backups": 0})
c.close()
EOF
  kill -9 "$PID_5"
  /usr/bin/python3 - "$(http_port 1)" "$(http_port 2)" "$(http_port 3)" "$(http_port 4)" <<'EOF'
import json, sys, time, urllib.request
# The management API needs a login: quayd's default guest (an administrator, from loopback).
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
urllib.request.install_opener(_login)
ports = [int(p) for p in sys.argv[1:]]
def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=30) as r:
        return json.load(r)
def b5_state():
    return {b["name"]: b["state"] for b in get(ports[0], "/api/cluster")["brokers"]}.get("b5")
deadline = time.time() + 60
while b5_state() != "down" and time.time() < deadline:
    time.sleep(0.1)
# The failover first: every queue with a backup promoted.
while time.time() < deadline and any(q["primary"] == "b5" and q["backups"]
                                     for q in get(ports[0], "/api/queues")):
    time.sleep(0.2)
t0 = time.time()
req = urllib.request.Request("http://127.0.0.1:%d/api/cluster/forget" % ports[0],
                             data=b'{"broker": "b5"}', method="POST",
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    report = json.load(r)
def done():
    if any(any(b["name"] == "b5" for b in get(p, "/api/cluster")["brokers"]) for p in ports):
        return False
    qs = get(ports[0], "/api/queues")
    if any(q["primary"] == "b5" or "b5" in q["backups"] or not q["available"] or
           (q["replication_factor"] > 1 and not q["backups"]) for q in qs):
        return False
    raft = get(ports[0], "/api/cluster").get("raft", {})
    return len(raft.get("followers", [])) == 3
while not done() and time.time() < deadline + 60:
    time.sleep(0.1)
print("ROW forget queues=%d emptied=%d promoted=%d backups_replaced=%d done_s=%.2f status=%s" % (
    len(get(ports[0], "/api/queues")), report["emptied"], report["promoted"],
    report["backups_replaced"], time.time() - t0, "ok" if done() else "fail"))
EOF
  stop_all
}

# link_bytes N PEER: the bytes broker N sent to and received from PEER on its link.
link_bytes() {
  curl -s -u guest:guest "http://127.0.0.1:$(http_port "$1")/metrics" |
    awk -v peer="peer=\"$2\"" 'index($0, peer) && /^quay_cluster_link_(sent|received)_bytes_total/ {s += $2} END {printf "%d\n", s}'
}

row_sharedha() {
  need_amqpbench
  local saved_args=${QUAYD_ARGS:-}
  QUAYD_ARGS="$saved_args --shared-storage $TMP/shared --auto-rebalance off"
  form 3
  QUAYD_ARGS=$saved_args
  local q
  for q in ha-all ha-transient ha-none; do
    /usr/bin/python3 - "$(amqp_port 1)" "$(http_port 1)" "$q" <<'EOF2'
import json, sys, time, urllib.request
import pika
port, http, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
args = {"x-quay-backups": 0 if name == "ha-none" else 1}
if name == "ha-transient":
    args["x-quay-replicate"] = "transient"
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
c.channel().queue_declare(name, durable=True, arguments=args)
c.close()
def info():
    with _login.open("http://127.0.0.1:%d/api/queues" % http, timeout=30) as r:
        return next(q for q in json.load(r) if q["name"] == name)
def move(body):
    req = urllib.request.Request("http://127.0.0.1:%d/api/cluster/move" % http,
                                 json.dumps(dict(body, vhost="/", queue=name)).encode(),
                                 {"Content-Type": "application/json"}, method="POST")
    _login.open(req, timeout=30).read()
def settled(want):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        q = info()
        if want(q):
            return q
        time.sleep(0.1)
    sys.exit("%s: never placed: %s" % (name, info()))
if info()["primary"] != "b1":
    move({"to": "b1"})
    settled(lambda q: q["primary"] == "b1" and q["in_sync"] == q["backups"])
want = [] if name == "ha-none" else ["b2"]
if info()["backups"] != want:
    move({"to": "b2", "backup_of": info()["backups"][0]})
settled(lambda q: q["primary"] == "b1" and q["backups"] == want and q["in_sync"] == want)
EOF2
  done
  declare -A ha_rates=() ha_bytes=()
  for rep in $(seq 1 "$REPS"); do
    for q in ha-all ha-transient ha-none; do
      local before after r pub per
      before=$(( $(link_bytes 1 b2) + $(link_bytes 2 b1) ))
      r=$("$AMQPBENCH" -p "$(amqp_port 1)" -q "$q" --no-setup -s 1024 -d "$DURATION" \
          --confirm -w 1000 --prefetch 100 --persistent --durable --check --keep | grep '^RESULT')
      after=$(( $(link_bytes 1 b2) + $(link_bytes 2 b1) ))
      case "$r" in *" lost=0 "*) ;; *) echo "ROW sharedha status=fail ($q: lost messages)"; exit 1 ;; esac
      pub=$(echo "$r" | field published)
      per=$(awk -v b=$((after - before)) -v n="$pub" 'BEGIN {printf "%.1f", (n > 0 ? b / n : 0)}')
      echo "# $q rep $rep: $r"
      echo "# $q rep $rep: link bytes b1<->b2 $((after - before)) for $pub published: $per per message"
      ha_rates[$q]="${ha_rates[$q]:-} $(echo "$r" | field pub_rate)"
      ha_bytes[$q]="${ha_bytes[$q]:-} $per"
    done
  done
  local out=""
  for q in ha-all ha-transient ha-none; do
    # shellcheck disable=SC2086 # split the lists
    out="$out $q=$(printf '%s\n' ${ha_rates[$q]} | median)msg/s,$(printf '%s\n' ${ha_bytes[$q]} | median)B/msg"
  done
  echo "ROW sharedha size=1024 persistent confirm window=1000 prefetch=100$out" \
    "(published msg/s; link bytes b1<->b2 per published message)"
  # The failover's cost: the queues SHAREDHA_FILL names filled with SHAREDHA_MESSAGES
  # persistent 1 KiB messages each, kill -9 of b1; when ha-all and ha-transient answer a
  # passive declare through b3 with their counts (ha-all: b2 promotes its replica;
  # ha-transient: b2 takes b1's log over, and its loop waits for that: fill one at a time
  # to see each queue's own time).
  # shellcheck disable=SC2086 # a list of names
  printf '%s\n' $SHAREDHA_FILL > "$TMP/ha-names"
  "$BENCH_OUT/quayscale" fill -H 127.0.0.1 -p "$(amqp_port 1)" --names "$TMP/ha-names" \
    -n "$SHAREDHA_MESSAGES" -s 1024 > /dev/null
  sleep 1
  kill -9 "$PID_1"
  local killed
  killed=$(date +%s.%N)
  /usr/bin/python3 - "$(amqp_port 3)" "$SHAREDHA_MESSAGES" "$killed" "$SHAREDHA_FILL" <<'EOF2'
import sys, threading, time
import pika
port, want, killed = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
filled = sys.argv[4].split()
serving = {}

def poll(name):  # its own connection: a declare that waits does not hold the other's
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    count = want if name in filled else 0
    while time.time() < killed + 120:
        try:
            if ch.queue_declare(name, passive=True).method.message_count == count:
                serving[name] = time.time() - killed
                break
        except pika.exceptions.ChannelClosedByBroker:
            ch = conn.channel()
        time.sleep(0.01)
    conn.close()
threads = [threading.Thread(target=poll, args=(n,)) for n in ("ha-all", "ha-transient")]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ROW sharedha-failover messages=%d filled=%s ha-all_serving_s=%s ha-transient_serving_s=%s" % (
    want, ",".join(filled), *("%.2f" % serving[n] if n in serving else "never" for n in ("ha-all", "ha-transient"))))
EOF2
  stop_all
}

row_takeover() {
  local saved_args=${QUAYD_ARGS:-}
  QUAYD_ARGS="$saved_args --shared-storage $TMP/shared --auto-rebalance off"
  form 3
  QUAYD_ARGS=$saved_args
  # Durable queues without backups, declared through b1 until b3 is primary of enough.
  /usr/bin/python3 - "$(amqp_port 1)" "$(http_port 1)" "$TAKEOVER_QUEUES" "$TMP/names" <<'EOF'
import json, sys, urllib.request
import pika
port, http, want, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
ch = c.channel()
names, batch = [], 0
while len(names) < want:
    for i in range(batch, batch + want):
        ch.queue_declare("tk-%d" % i, durable=True, arguments={"x-quay-backups": 0})
    batch += want
    with _login.open("http://127.0.0.1:%d/api/queues?columns=name,primary" % http,
                     timeout=60) as r:
        names = sorted(q["name"] for q in json.load(r) if q["primary"] == "b3")
for q in set("tk-%d" % i for i in range(batch)) - set(names[:want]):
    ch.queue_delete(q)
c.close()
with open(out, "w") as f:
    f.write("\n".join(names[:want]) + "\n")
EOF
  local per=$((TAKEOVER_MESSAGES / TAKEOVER_QUEUES)) fill
  fill=$("$BENCH_OUT/quayscale" fill -H 127.0.0.1 -p "$(amqp_port 3)" --names "$TMP/names" \
      -n "$per" -s 1024)
  sleep 1
  # TAKEOVER_PERF=PREFIX: perf record -g of the takers (b1, b2) for the
  # first 10 s after the kill, into PREFIX.b1 and PREFIX.b2.
  local perfs=()
  if [ -n "${TAKEOVER_PERF:-}" ]; then
    for n in 1 2; do
      local pid_var="PID_$n"
      perf record -g -F 999 -o "$TAKEOVER_PERF.b$n" -p "${!pid_var}" -- sleep 10 \
        >/dev/null 2>&1 & perfs+=($!)
    done
    sleep 0.5
  fi
  # TAKEOVER_SYSCALLS=1: perf stat counts the takers' (b1, b2) fsync,
  # fdatasync and rename calls for TAKEOVER_SYSCALLS_S (20) s from the kill.
  local counting=""
  if [ -n "${TAKEOVER_SYSCALLS:-}" ]; then
    perf stat -e syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync \
      -e syscalls:sys_enter_rename -p "$PID_1,$PID_2" -o "$TMP/syscalls" \
      -- sleep "${TAKEOVER_SYSCALLS_S:-20}" >/dev/null 2>&1 & counting=$!
    sleep 0.5
  fi
  kill -9 "$PID_3"
  local killed
  killed=$(date +%s.%N)
  /usr/bin/python3 - "$(amqp_port 1)" "$(http_port 1)" "$TMP/names" "$per" "$killed" <<'EOF'
import json, sys, time, urllib.request
import pika
port, http, path, per, killed = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                 int(sys.argv[4]), float(sys.argv[5]))
names = open(path).read().split()
_login = urllib.request.build_opener()
_login.addheaders = [("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")]  # guest:guest
deadline = killed + 300
mapped = None
while time.time() < deadline:
    with _login.open("http://127.0.0.1:%d/api/queues?columns=name,primary,available" % http,
                     timeout=60) as r:
        qs = {q["name"]: q for q in json.load(r)}
    if all(qs[n]["primary"] in ("b1", "b2") and qs[n].get("available", True) for n in names):
        mapped = time.time() - killed
        break
    time.sleep(0.05)
# Serving: every queue answers through b1 with all of its messages.
conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
ch = conn.channel()
left = list(names)
while left and time.time() < deadline:
    still = []
    for n in left:
        try:
            if ch.queue_declare(n, passive=True).method.message_count != per:
                still.append(n)
        except pika.exceptions.ChannelClosedByBroker:
            still.append(n)
            ch = conn.channel()
    left = still
    if left:
        time.sleep(0.05)
serving = time.time() - killed
got, first = 0, names[0]
while True:
    m, _, body = ch.basic_get(first, auto_ack=True)
    if m is None:
        break
    got += 1
conn.close()
print("TAKEOVER mapped_s=%.2f serving_s=%.2f not_serving=%d read_back=%d/%d" % (
    mapped if mapped is not None else -1, serving, len(left), got, per), flush=True)
EOF
  for p in "${perfs[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "$counting" ]; then
    wait "$counting" 2>/dev/null || true
    echo "SYSCALLS $(awk '/syscalls:/ {gsub(/,/, "", $1); sub(/syscalls:sys_enter_/, "", $2);
                          printf "%s=%s ", $2, $1}' "$TMP/syscalls")"
  fi
  echo "ROW takeover queues=$TAKEOVER_QUEUES messages=$TAKEOVER_MESSAGES" \
       "fill_msgs_per_s=$(echo "$fill" | field msgs_per_s)" \
       "shared_mb=$(du -sm "$TMP/shared" | cut -f1)"
  stop_all
  rm -rf "$TMP/shared"
}

for row in $ROWS; do
  case "$row" in
    proxy) row_proxy ;;
    failover) row_failover ;;
    scale) row_scale ;;
    replicated) row_replicated ;;
    cut|kill9) row_probe "$row" ;;
    heal) row_heal ;;
    fanout) row_fanout ;;
    forget) row_forget ;;
    move) row_move ;;
    drain) row_drain ;;
    join) row_join ;;
    takeover) row_takeover ;;
    sharedha) row_sharedha ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
done
