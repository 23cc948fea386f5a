#!/usr/bin/env bash
# bench/mgmt_scrape.sh: what a Prometheus scrape of /metrics every second costs the message
# path (issue 20's target "the 1 KiB message rate drops < 5% while Prometheus scrapes every
# second"; bench/RESULTS.md "Issue 20's management targets").
#
# Brokers run side by side for the whole run: E (QUAYD, empty) and Q (QUAYD, QUEUES idle
# queues, declared with quayscale), and with QUAYD_A also A (QUAYD_A, QUEUES idle queues: the
# base of an A/B). Per repetition, in this order, each for DURATION s:
#   [A alone, A scraped,] E alone, E scraped, Q alone, Q scraped
# where "scraped" means a loop that GETs /metrics of the broker under test with curl every
# PERIOD s (default 1, from start to start, output thrown away) for the length of the run; the
# row is `amqpbench $ROW -d DURATION --check --watch-pid PID` (ROW: the 1 KiB row, by default
# with confirms and acks as issue 20 asks: -s 1024 --confirm -w 1000 --prefetch 100).
# Prints one line per run (msg/s consumed, broker CPU us per message, the client's p99 and max
# end-to-end latency, the scrapes' curl times) and the medians, and the scraped/alone ratios.
# The max latency is where a stall of the broker's loop shows (every message in flight waits
# it out); the p99 and p99.9 are where frequent ones do. At full speed a 1,000-message window
# keeps tens of ms of latency of its own; the probe row (ROW='-s 1024 -r 2000 --confirm -w 10
# --prefetch 100': 2,000 msg/s, latency ~0.1-1 ms) shows a stall nearly as it is. EMPTY=0
# leaves out E (the control without queues). The machine is shared: interleaving and medians are what make the comparison fair;
# the broker CPU per message is the steadier figure.
#
#   QUAYD=build/quayd REPS=5 DURATION=10 bench/mgmt_scrape.sh
#   QUAYD_A=/tmp/base-quayd QUAYD=build/quayd REPS=5 bench/mgmt_scrape.sh    # with A
#   ... PERIOD=0.2 ... (a scrape every 0.2 s: the stress)
#   ... ROW='-s 1024 --auto-ack' ... (the row of the runs before 2026-12-03's scrape20)
#
# Needs librabbitmq-dev, curl, and ../shared/bench (amqpbench).
set -euo pipefail
cd "$(dirname "$0")/.."
QUAYD=${QUAYD:-build/quayd}
QUAYD_A=${QUAYD_A:-}
REPS=${REPS:-5}
QUEUES=${QUEUES:-50000}
DURATION=${DURATION:-10}
PERIOD=${PERIOD:-1}
ROW=${ROW:--s 1024 --confirm -w 1000 --prefetch 100}
EMPTY=${EMPTY:-1}
PORT=${PORT:-$((20000 + RANDOM % 9000))}
BENCH_OUT=${BENCH_OUT:-build/bench}
SHARED=${SHARED:-../shared/bench}
[ -d "$SHARED" ] || SHARED=/work/shared/bench

mkdir -p "$BENCH_OUT"
RMQC_FLAGS=$(pkg-config --cflags --libs librabbitmq 2>/dev/null || echo "-lrabbitmq")
# shellcheck disable=SC2086
cc -O2 -g -std=c17 -Wall -Wextra bench/quayscale.c -o "$BENCH_OUT/quayscale" $RMQC_FLAGS -lpthread
make -s -f "$SHARED/Makefile" OUT="$(realpath "$BENCH_OUT")" "$(realpath "$BENCH_OUT")/amqpbench" \
  >/dev/null
TMP=$(mktemp -d /tmp/mgmt-scrape.XXXXXX)
PIDS=()
SCRAPER=
cleanup() {
  [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

start() { # name amqp_port http_port [binary] -> PID in $STARTED
  "${4:-$QUAYD}" --listen "127.0.0.1:$2" --http "127.0.0.1:$3" --data "$TMP/$1" >"$TMP/$1.log" 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
  for _ in $(seq 100); do
    ss -ltn | grep -q ":$2 " && return 0
    sleep 0.1
  done
  echo "quayd $1 did not listen" >&2
  exit 1
}
LABELS="Q-alone Q-scraped"
if [ "$EMPTY" = 1 ]; then
  start E "$PORT" $((PORT + 1)); PID_E=$STARTED
  LABELS="E-alone E-scraped $LABELS"
fi
start Q $((PORT + 2)) $((PORT + 3)); PID_Q=$STARTED
"$BENCH_OUT/quayscale" queues -p $((PORT + 2)) -n "$QUEUES" --keep >"$TMP/scale.out" 2>&1
if [ -n "$QUAYD_A" ]; then
  start A $((PORT + 4)) $((PORT + 5)) "$QUAYD_A"; PID_A=$STARTED
  "$BENCH_OUT/quayscale" queues -p $((PORT + 4)) -n "$QUEUES" --keep >"$TMP/scale-a.out" 2>&1
  LABELS="A-alone A-scraped $LABELS"
fi
sleep 5

field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -1; }

scrape_loop() { # http_port out: a GET of /metrics every PERIOD s, start to start
  while :; do
    local t0
    t0=$(date +%s.%N)
    curl -s -u guest:guest -o /dev/null -w '%{time_total} %{size_download}\n' \
      "http://127.0.0.1:$1/metrics" >>"$2"
    sleep "$(echo "$PERIOD - ($(date +%s.%N) - $t0)" | bc | sed 's/^-.*/0/')"
  done
}

run_one() { # label amqp_port http_port pid scrape(0|1)
  local label=$1 port=$2 http=$3 pid=$4 scrape=$5 line us scr="-" load
  : >"$TMP/scrapes"
  if [ "$scrape" = 1 ]; then
    scrape_loop "$http" "$TMP/scrapes" &
    SCRAPER=$!
  fi
  # shellcheck disable=SC2086
  line=$("$BENCH_OUT/amqpbench" -p "$port" $ROW -d "$DURATION" --check \
         --watch-pid "$pid" | grep RESULT)
  if [ -n "$SCRAPER" ]; then
    kill "$SCRAPER"; wait "$SCRAPER" 2>/dev/null || true; SCRAPER=
    scr="$(wc -l <"$TMP/scrapes")x_median_s=$(cut -d' ' -f1 "$TMP/scrapes" | median)"
    scr="${scr}_bytes=$(tail -1 "$TMP/scrapes" | cut -d' ' -f2)"
  fi
  us=$(awk -v c="$(field srv_cpu_pct "$line")" -v e="$(field elapsed_s "$line")" \
           -v n="$(field consumed "$line")" 'BEGIN {printf "%.3f", c / 100 * e / n * 1e6}')
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "$label rate=$(field cons_rate "$line") us_per_msg=$us p99_us=$(field lat_p99_us "$line")" \
       "p999_us=$(field lat_p999_us "$line") max_us=$(field lat_max_us "$line")" \
       "lost=$(field lost "$line")" \
       "dup=$(field dup "$line") scrapes=$scr load=$load" | tee -a "$TMP/results"
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

for rep in $(seq "$REPS"); do
  echo "== rep $rep"
  if [ -n "$QUAYD_A" ]; then
    run_one A-alone $((PORT + 4)) $((PORT + 5)) "$PID_A" 0
    run_one A-scraped $((PORT + 4)) $((PORT + 5)) "$PID_A" 1
  fi
  if [ "$EMPTY" = 1 ]; then
    run_one E-alone "$PORT" $((PORT + 1)) "$PID_E" 0
    run_one E-scraped "$PORT" $((PORT + 1)) "$PID_E" 1
  fi
  run_one Q-alone $((PORT + 2)) $((PORT + 3)) "$PID_Q" 0
  run_one Q-scraped $((PORT + 2)) $((PORT + 3)) "$PID_Q" 1
done

echo "== medians of $REPS (amqpbench $ROW, $DURATION s; a scrape every $PERIOD s;" \
     "Q${QUAYD_A:+ and A} $QUEUES idle queues)"
for label in $LABELS; do
  r=$(grep "^$label " "$TMP/results" | sed -n 's/.* rate=\([0-9.]*\).*/\1/p' | median)
  u=$(grep "^$label " "$TMP/results" | sed -n 's/.* us_per_msg=\([0-9.]*\).*/\1/p' | median)
  p=$(grep "^$label " "$TMP/results" | sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' | median)
  t=$(grep "^$label " "$TMP/results" | sed -n 's/.* p999_us=\([0-9.]*\).*/\1/p' | median)
  m=$(grep "^$label " "$TMP/results" | sed -n 's/.* max_us=\([0-9.]*\).*/\1/p' | median)
  echo "$label rate=$r us_per_msg=$u p99_us=$p p999_us=$t max_us=$m"
  eval "R_${label%-*}_${label#*-}=$r U_${label%-*}_${label#*-}=$u"
done
for b in ${QUAYD_A:+A} $([ "$EMPTY" = 1 ] && echo E) Q; do
  eval "ra=\$R_${b}_alone rs=\$R_${b}_scraped ua=\$U_${b}_alone us=\$U_${b}_scraped"
  # shellcheck disable=SC2154
  echo "$b scraped/alone: rate $(echo "scale=3; $rs / $ra" | bc)," \
       "broker CPU per message $(echo "scale=3; $us / $ua" | bc)"
done
