#!/usr/bin/env bash
# bench/mgmt_scale.sh: GET /metrics and GET /api/overview of a broker holding QUEUES idle
# queues, two quayd binaries side by side (issue 20's targets "/metrics with 50,000 queues
# answers in < 1 s" and "/api/overview without a walk of the queues"; bench/RESULTS.md
# "Issue 20's management targets").
#
# Both brokers run for the whole run (A and B), each with QUEUES queues declared by
# `quayscale queues -n QUEUES --keep`; then REPS rounds, each: SCRAPES /metrics of A, then
# OVERVIEWS /api/overview of A, then the same of B (interleaved: the machine is shared). Per
# scrape: curl's time_total and time_starttransfer (the broker has built the answer when its
# first byte leaves) and size_download (a round's median); per round and broker: the
# broker's CPU (utime + stime, /proc/PID/stat, 10 ms ticks) over the round's scrapes and over
# its overviews, per request. Prints every round and the medians of the rounds.
#
#   QUAYD_A=/tmp/base-quayd QUAYD_B=build/quayd REPS=7 bench/mgmt_scale.sh
#
# Needs librabbitmq-dev (quayscale is built into $BENCH_OUT), curl, bc.
set -euo pipefail
cd "$(dirname "$0")/.."
QUAYD_A=${QUAYD_A:?the base quayd}
QUAYD_B=${QUAYD_B:-build/quayd}
REPS=${REPS:-7}
QUEUES=${QUEUES:-50000}
OVERVIEWS=${OVERVIEWS:-50}
SCRAPES=${SCRAPES:-5}
PORT=${PORT:-$((20000 + RANDOM % 9000))}
BENCH_OUT=${BENCH_OUT:-build/bench}

mkdir -p "$BENCH_OUT"
RMQC_FLAGS=$(pkg-config --cflags --libs librabbitmq 2>/dev/null || echo "-lrabbitmq")
# shellcheck disable=SC2086
cc -O2 -g -std=c17 -Wall -Wextra bench/quayscale.c -o "$BENCH_OUT/quayscale" $RMQC_FLAGS -lpthread
TMP=$(mktemp -d /tmp/mgmt-scale.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

start() { # name binary amqp_port http_port -> PID in $STARTED
  "$2" --listen "127.0.0.1:$3" --http "127.0.0.1:$4" --data "$TMP/$1" >"$TMP/$1.log" 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
  for _ in $(seq 100); do
    ss -ltn | grep -q ":$3 " && break
    sleep 0.1
  done
  "$BENCH_OUT/quayscale" queues -p "$3" -n "$QUEUES" --keep >"$TMP/$1.scale" 2>&1
}
start A "$QUAYD_A" "$PORT" $((PORT + 1)); PID_A=$STARTED
start B "$QUAYD_B" $((PORT + 2)) $((PORT + 3)); PID_B=$STARTED
HTTP_A=$((PORT + 1))
HTTP_B=$((PORT + 3))
sleep 5

cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
fetch() { # http_port path -> "total ttfb size"
  curl -s -u guest:guest -o /dev/null -w '%{time_total} %{time_starttransfer} %{size_download}' \
    "http://127.0.0.1:$1$2"
}

one() { # label http_port pid
  local c0 c1 m o total=0 t
  : >"$TMP/scrapes"
  c0=$(cpu_ms "$3")
  for _ in $(seq "$SCRAPES"); do
    fetch "$2" /metrics >>"$TMP/scrapes"
    echo >>"$TMP/scrapes"
  done
  c1=$(cpu_ms "$3")
  m="$(cut -d' ' -f1 "$TMP/scrapes" | median) $(cut -d' ' -f2 "$TMP/scrapes" | median)"
  m="$m $(cut -d' ' -f3 "$TMP/scrapes" | median)"
  echo "$1 metrics total_s=$(cut -d' ' -f1 <<<"$m") ttfb_s=$(cut -d' ' -f2 <<<"$m")" \
       "bytes=$(cut -d' ' -f3 <<<"$m")" \
       "cpu_ms=$(echo "scale=1; ($c1 - $c0) / $SCRAPES" | bc)" \
       "load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$TMP/results"
  c0=$(cpu_ms "$3")
  for _ in $(seq "$OVERVIEWS"); do
    o=$(fetch "$2" /api/overview)
    t=$(cut -d' ' -f1 <<<"$o")
    total=$(echo "$total + $t" | bc)
  done
  c1=$(cpu_ms "$3")
  echo "$1 overview mean_total_ms=$(echo "scale=3; $total * 1000 / $OVERVIEWS" | bc)" \
       "bytes=$(cut -d' ' -f3 <<<"$o")" \
       "cpu_ms_per_request=$(echo "scale=3; ($c1 - $c0) / $OVERVIEWS" | bc)" | tee -a "$TMP/results"
}

for rep in $(seq "$REPS"); do
  echo "== round $rep"
  one A "$HTTP_A" "$PID_A"
  one B "$HTTP_B" "$PID_B"
done

echo "== medians of $REPS rounds ($QUEUES queues; $SCRAPES scrapes and $OVERVIEWS overviews a round)"
for b in A B; do
  line="$b"
  for f in total_s ttfb_s bytes cpu_ms; do
    line="$line metrics_$f=$(grep "^$b metrics" "$TMP/results" | tr ' ' '\n' | sed -n "s/^$f=//p" | median)"
  done
  for f in mean_total_ms cpu_ms_per_request; do
    line="$line overview_$f=$(grep "^$b overview" "$TMP/results" | tr ' ' '\n' | sed -n "s/^$f=//p" | median)"
  done
  echo "$line"
done
