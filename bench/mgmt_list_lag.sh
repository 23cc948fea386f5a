#!/usr/bin/env bash
# bench/mgmt_list_lag.sh: what GET /api/queues (or another list: LIST=bindings, ...) of many
# queues, asked again and again, costs the message path (bench/RESULTS.md "Lists in slices"
# and "Every long list in slices"). Before, the whole list was built in one loop turn (2-3 s
# for 50,000 queues): every client of the broker waited that long, once a list.
#
# Brokers run side by side for the whole run: A (QUAYD_A, the base) and B (QUAYD), each with
# QUEUES idle queues (quayscale). Per repetition, in this order, each for DURATION s:
#   A alone, A listed, B alone, B listed
# where "listed" means a loop that GETs LIST_PATH (default /api/$LIST, LIST default queues:
# what `rabbitmqadmin list queues` asks, without its columns=; LIST=bindings lists each queue's
# default binding and the one quayscale adds) of the broker under test with curl, back to back,
# for the length of the run. The row is `amqpbench $ROW -d DURATION --check --watch-pid PID`
# (ROW: 1 KiB messages with confirms and acks, as issue 20's targets). Meanwhile a sampler
# reads quay_event_loop_lag_seconds (the longest loop iteration of the last 5-10 s) from the
# broker's /metrics every 2 s: the run's lag is the largest it read. Prints one line per run
# (msg/s consumed, broker CPU us per message, the client's p99 and max latency, the lists'
# count and median curl time, the lag) and the medians.
#
#   QUAYD_A=/tmp/base-quayd QUAYD=build/quayd REPS=5 DURATION=10 bench/mgmt_list_lag.sh
#   ... LIST_PATH='/api/queues?columns=name,messages' ... (rabbitmqadmin's table)
#   ... LIST=bindings ...                                 (GET /api/bindings)
#   ... FILL=channels LIST=channels QUEUES=0 ...          (16,000 channels: CHANNELS=)
#   ... ONCE=1 ...                (one GET at a time instead, A then B, 11 s apart)
#
# FILL=channels (or consumers: a consumer on each channel) adds CHANNELS open channels to
# each broker (bench/hold_channels.py, 2,000 a connection), after its QUEUES queues. ONCE=1
# runs no amqpbench: per rep it GETs LIST_PATH once from A, then from B, each after 11 s of
# quiet (the lag gauge spans 5-10 s), and prints the time to the first byte and the lag read
# after it (the longest loop iteration around the GET).
#
# Needs librabbitmq-dev, curl, and ../shared/bench (amqpbench).
set -euo pipefail
cd "$(dirname "$0")/.."
QUAYD=${QUAYD:-build/quayd}
QUAYD_A=${QUAYD_A:?the base quayd to compare with}
REPS=${REPS:-5}
QUEUES=${QUEUES:-50000}
DURATION=${DURATION:-10}
LIST=${LIST:-queues}
FILL=${FILL:-}
CHANNELS=${CHANNELS:-16000}
ONCE=${ONCE:-0}
LIST_PATH=${LIST_PATH:-/api/$LIST}
ROW=${ROW:--s 1024 --confirm -w 1000 --prefetch 100}
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
TMP=$(mktemp -d /tmp/mgmt-list.XXXXXX)
PIDS=()
LISTER=
SAMPLER=
cleanup() {
  set +e # (a run that failed under set -e left its brokers running)
  [ -n "$LISTER" ] && kill "$LISTER" 2>/dev/null
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

start() { # name amqp_port http_port binary -> PID in $STARTED
  "$4" --listen "127.0.0.1:$2" --http "127.0.0.1:$3" --data "$TMP/$1" >"$TMP/$1.log" 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
  for _ in $(seq 100); do
    ss -ltn | grep -q ":$2 " && return 0
    sleep 0.1
  done
  echo "quayd $1 did not listen" >&2
  exit 1
}
fill() { # name amqp_port: QUEUES queues, then FILL's channels (held until the end)
  [ "$QUEUES" -gt 0 ] &&
    "$BENCH_OUT/quayscale" queues -p "$2" -n "$QUEUES" --keep >"$TMP/scale-$1.out" 2>&1
  [ -z "$FILL" ] && return 0
  local flag=
  [ "$FILL" = consumers ] && flag=--consumers
  /usr/bin/python3 bench/hold_channels.py "$2" "$CHANNELS" $flag >"$TMP/hold-$1.out" 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 600); do
    grep -q ready "$TMP/hold-$1.out" && return 0
    sleep 0.5
  done
  echo "hold_channels $1 did not get ready" >&2
  exit 1
}
start A "$PORT" $((PORT + 1)) "$QUAYD_A"; PID_A=$STARTED
fill a "$PORT"
start B $((PORT + 2)) $((PORT + 3)) "$QUAYD"; PID_B=$STARTED
fill b $((PORT + 2))
sleep 5

field() { tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p" | head -1; }
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

list_loop() { # http_port out: GET LIST_PATH back to back
  while :; do
    curl -s -u guest:guest -o /dev/null -w '%{time_total} %{size_download}\n' \
      "http://127.0.0.1:$1$LIST_PATH" >>"$2" || true
  done
}

lag_loop() { # http_port out: the loop lag gauge every 2 s
  while :; do
    { curl -s -m 5 -u guest:guest "http://127.0.0.1:$1/metrics" |
        sed -n 's/^quay_event_loop_lag_seconds //p' >>"$2"; } || true
    sleep 2
  done
}

run_one() { # label amqp_port http_port pid listed(0|1)
  local label=$1 port=$2 http=$3 pid=$4 listed=$5 line us lists="-" lag load
  # Files of this run alone: a curl of the last run's loops, still in flight when they
  # were killed, may write after them (a lag read from the other broker).
  RUN=$((${RUN:-0} + 1))
  local list_file="$TMP/lists.$RUN" lag_file="$TMP/lags.$RUN"
  if [ "$listed" = 1 ]; then
    list_loop "$http" "$list_file" &
    LISTER=$!
  fi
  lag_loop "$http" "$lag_file" &
  SAMPLER=$!
  # shellcheck disable=SC2086
  line=$("$BENCH_OUT/amqpbench" -p "$port" $ROW -d "$DURATION" --check \
         --watch-pid "$pid" | grep RESULT)
  kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=
  if [ -n "$LISTER" ]; then
    kill "$LISTER" 2>/dev/null || true; wait "$LISTER" 2>/dev/null || true; LISTER=
    lists="$(wc -l <"$list_file")x_median_s=$(cut -d' ' -f1 "$list_file" | median)"
    lists="${lists}_bytes=$(tail -1 "$list_file" | cut -d' ' -f2)"
  fi
  lag=$(sort -g "$lag_file" | tail -1)
  us=$(awk -v c="$(field srv_cpu_pct "$line")" -v e="$(field elapsed_s "$line")" \
           -v n="$(field consumed "$line")" 'BEGIN {printf "%.3f", c / 100 * e / n * 1e6}')
  load=$(cut -d' ' -f1 /proc/loadavg)
  echo "$label rate=$(field cons_rate "$line") us_per_msg=$us p99_us=$(field lat_p99_us "$line")" \
       "max_us=$(field lat_max_us "$line") lost=$(field lost "$line") dup=$(field dup "$line")" \
       "lists=$lists lag_s=$lag load=$load" | tee -a "$TMP/results"
}

lag_now() { # http_port
  curl -s -m 30 -u guest:guest "http://127.0.0.1:$1/metrics" |
    sed -n 's/^quay_event_loop_lag_seconds //p'
}

once() { # label http_port: one GET after 11 s of quiet, then the lag
  local got
  sleep 11
  got=$(curl -s -u guest:guest -o /dev/null -w '%{time_starttransfer} %{size_download}' \
          "http://127.0.0.1:$2$LIST_PATH")
  echo "$1 first_byte_s=${got% *} bytes=${got#* } lag_s=$(lag_now "$2")" \
       "load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$TMP/results"
}

if [ "$ONCE" = 1 ]; then
  for rep in $(seq "$REPS"); do
    once A "$((PORT + 1))"
    once B "$((PORT + 3))"
  done
  echo "== medians of $REPS (GET $LIST_PATH once; $QUEUES queues${FILL:+, $CHANNELS channels})"
  for label in A B; do
    f=$(grep "^$label " "$TMP/results" | sed -n 's/.* first_byte_s=\([0-9.]*\).*/\1/p' | median)
    g=$(grep "^$label " "$TMP/results" | sed -n 's/.* lag_s=\([0-9.e+-]*\).*/\1/p' | median)
    echo "$label first_byte_s=$f lag_s=$g"
  done
  exit 0
fi

for rep in $(seq "$REPS"); do
  echo "== rep $rep"
  run_one A-alone "$PORT" $((PORT + 1)) "$PID_A" 0
  run_one A-listed "$PORT" $((PORT + 1)) "$PID_A" 1
  run_one B-alone $((PORT + 2)) $((PORT + 3)) "$PID_B" 0
  run_one B-listed $((PORT + 2)) $((PORT + 3)) "$PID_B" 1
done

echo "== medians of $REPS (amqpbench $ROW, $DURATION s; GET $LIST_PATH back to back;" \
     "$QUEUES idle queues${FILL:+, $CHANNELS channels})"
for label in A-alone A-listed B-alone B-listed; do
  r=$(grep "^$label " "$TMP/results" | sed -n 's/.* rate=\([0-9.]*\).*/\1/p' | median)
  u=$(grep "^$label " "$TMP/results" | sed -n 's/.* us_per_msg=\([0-9.]*\).*/\1/p' | median)
  p=$(grep "^$label " "$TMP/results" | sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' | median)
  m=$(grep "^$label " "$TMP/results" | sed -n 's/.* max_us=\([0-9.]*\).*/\1/p' | median)
  g=$(grep "^$label " "$TMP/results" | sed -n 's/.* lag_s=\([0-9.e+-]*\).*/\1/p' | median)
  echo "$label rate=$r us_per_msg=$u p99_us=$p max_us=$m lag_s=$g"
done
