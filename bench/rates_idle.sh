#!/usr/bin/env bash
# bench/rates_idle.sh: what sampling message rates costs a broker holding many idle
# queues (issue 20, item 1's cost; bench/RESULTS.md "Message rates").
#
# For each repetition, and each of two quayd binaries in turn (A, B, A, B, ...: the machine
# is shared, so the two are interleaved and compared by their medians):
#   1. start the broker, declare QUEUES idle queues (quayscale, 4 connections), wait SETTLE s;
#   2. its idle CPU: utime + stime from /proc/PID/stat over IDLE_S seconds, as % of one core;
#   3. latency: a 1 KiB stream at RATE msg/s for DURATION s beside the idle queues, with
#      quaybench (`-s 1024 -d DURATION --rate RATE`, the command of the first measurement)
#      and with the shared amqpbench (`-s 1024 -d DURATION -r RATE --check`);
#   4. stop it.
# FLOOR=1 adds a run F of binary B without the idle queues after each pair: what the
# machine's other load costs the latency at that moment. Prints one line per run and
# the medians.
#
#   QUAYD_A=/tmp/base-quayd QUAYD_B=build/quayd REPS=3 bench/rates_idle.sh
#
# Needs librabbitmq-dev (the tools are built into $BENCH_OUT) and ../shared/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
QUAYD_A=${QUAYD_A:?the base quayd}
QUAYD_B=${QUAYD_B:-build/quayd}
REPS=${REPS:-3}
QUEUES=${QUEUES:-50000}
SETTLE=${SETTLE:-8}
IDLE_S=${IDLE_S:-30}
RATE=${RATE:-2000}
DURATION=${DURATION:-10}
PORT=${PORT:-5961}
FLOOR=${FLOOR:-0}   # 1: also B without the idle queues (F), the floor of this machine now
BENCH_OUT=${BENCH_OUT:-build/bench}
SHARED=${SHARED:-../shared/bench}
[ -d "$SHARED" ] || SHARED=/work/shared/bench

mkdir -p "$BENCH_OUT"
RMQC_FLAGS=$(pkg-config --cflags --libs librabbitmq 2>/dev/null || echo "-lrabbitmq")
for t in quaybench quayscale; do
  # shellcheck disable=SC2086
  cc -O2 -g -std=c17 -Wall -Wextra "bench/$t.c" -o "$BENCH_OUT/$t" $RMQC_FLAGS -lpthread
done
make -s -f "$SHARED/Makefile" OUT="$(realpath "$BENCH_OUT")" "$(realpath "$BENCH_OUT")/amqpbench" \
  >/dev/null
TMP=$(mktemp -d /tmp/rates-idle.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -1; }

run_one() { # label binary queues -> one line
  local label=$1 bin=$2 queues=$3
  rm -rf "$TMP/data"
  "$bin" --listen "127.0.0.1:$PORT" --data "$TMP/data" >"$TMP/$label.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do
    ss -ltn | grep -q ":$PORT " && break
    sleep 0.1
  done
  if [ "$queues" -gt 0 ]; then
    "$BENCH_OUT/quayscale" queues -p "$PORT" -n "$queues" --keep >"$TMP/scale.out" 2>&1
  fi
  sleep "$SETTLE"
  local hz t0 t1
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks "$PID")
  sleep "$IDLE_S"
  t1=$(cpu_ticks "$PID")
  local idle
  idle=$(echo "scale=3; ($t1 - $t0) * 100 / $hz / $IDLE_S" | bc)
  local qb ab
  qb=$("$BENCH_OUT/quaybench" -p "$PORT" -s 1024 -d "$DURATION" --rate "$RATE" | grep RESULT)
  ab=$("$BENCH_OUT/amqpbench" -p "$PORT" -s 1024 -d "$DURATION" -r "$RATE" --check \
       | grep RESULT)
  kill "$PID"
  wait "$PID" 2>/dev/null || true
  PID=
  echo "$label idle_cpu_pct=$idle" \
       "qb_p50=$(field lat_p50_us "$qb") qb_p99=$(field lat_p99_us "$qb")" \
       "qb_p999=$(field lat_p999_us "$qb") qb_max=$(field lat_max_us "$qb")" \
       "ab_p50=$(field lat_p50_us "$ab") ab_p99=$(field lat_p99_us "$ab")" \
       "ab_lost=$(field lost "$ab") ab_dup=$(field dup "$ab")"
}

RESULTS=$TMP/results
for rep in $(seq "$REPS"); do
  run_one A "$QUAYD_A" "$QUEUES" | tee -a "$RESULTS"
  run_one B "$QUAYD_B" "$QUEUES" | tee -a "$RESULTS"
  if [ "$FLOOR" = 1 ]; then run_one F "$QUAYD_B" 0 | tee -a "$RESULTS"; fi
done

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "== medians of $REPS ($QUEUES idle queues, $RATE msg/s of 1 KiB for $DURATION s)"
for label in A B F; do
  grep -q "^$label " "$RESULTS" || continue
  line="$label"
  for f in idle_cpu_pct qb_p50 qb_p99 qb_p999 qb_max ab_p50 ab_p99; do
    line="$line $f=$(grep "^$label " "$RESULTS" | tr ' ' '\n' | sed -n "s/^$f=//p" | median)"
  done
  echo "$line"
done
