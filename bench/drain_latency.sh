#!/usr/bin/env bash
# bench/drain_latency.sh: the confirm latency of a steady persistent publisher while a
# consumer drains a deep durable queue (bench/RESULTS.md "Confirms while a deep queue
# drains"). One broker; per run:
#   1. a durable queue gets BACKLOG persistent 1 KiB messages (pika, the last one confirmed);
#   2. quaybench publishes RATE msg/s persistent with confirms for DURATION s while one
#      consumer (prefetch 100) reads the backlog and the new messages;
#   3. prints quaybench's confirm latency p50/p99/max (its conf_*_us fields).
# As the consumer acks the backlog the journal's old segments empty and are compacted
# (their last live messages copied forward), which is what this row watches.
# Two binaries are interleaved (A, B, A, B, ...; the machine is shared) and compared
# by their medians:
#
#   QUAYD_A=/tmp/base-quayd QUAYD_B=build/quayd REPS=5 bench/drain_latency.sh
#
# Needs librabbitmq-dev (quaybench is built into $BENCH_OUT) and python3-pika.
set -euo pipefail
cd "$(dirname "$0")/.."
QUAYD_A=${QUAYD_A:?the base quayd}
QUAYD_B=${QUAYD_B:-build/quayd}
REPS=${REPS:-3}
BACKLOG=${BACKLOG:-100000}
RATE=${RATE:-5000}
DURATION=${DURATION:-6}
PORT=${PORT:-5971}
BENCH_OUT=${BENCH_OUT:-build/bench}
[ -x "$BENCH_OUT/quaybench" ] || cmake --build build --target quaybench >/dev/null

run_one() { # run_one LABEL QUAYD
  local label=$1 quayd=$2 dir pid
  dir=$(mktemp -d)
  "$quayd" --listen "127.0.0.1:$PORT" --data "$dir" > "$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    /usr/bin/python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT), 1)" \
        2>/dev/null && break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null || { echo "$quayd did not start: $(tail -1 "$dir/log")" >&2; exit 1; }
  /usr/bin/python3 - "$PORT" "$BACKLOG" <<'EOF'
import sys, pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
ch.queue_declare("drain-0", durable=True)
body, props = b"backlog!" * 128, pika.BasicProperties(delivery_mode=2)
for i in range(int(sys.argv[2]) - 1):
    ch.basic_publish("", "drain-0", body, props)
ch.confirm_delivery()
ch.basic_publish("", "drain-0", body, props)  # confirmed: so is everything before it
c.close()
EOF
  local out
  out=$("$BENCH_OUT/quaybench" -H 127.0.0.1 -p "$PORT" -P 1 -C 1 --prefetch 100 \
        --rate "$RATE" -d "$DURATION" --drain-timeout 10 --prefix drain --durable \
        --persistent --confirm --no-setup --keep) || true  # its status is "fail" for the foreign backlog
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  local p50 p99 max
  p50=$(sed -n 's/.* conf_p50_us=\([0-9]*\).*/\1/p' <<< "$out")
  p99=$(sed -n 's/.* conf_p99_us=\([0-9]*\).*/\1/p' <<< "$out")
  max=$(sed -n 's/.* conf_max_us=\([0-9]*\).*/\1/p' <<< "$out")
  echo "RUN $label conf_p50_ms=$((p50 / 1000)) conf_p99_ms=$((p99 / 1000)) conf_max_ms=$((max / 1000))"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

log=$(mktemp)
for _ in $(seq 1 "$REPS"); do
  run_one A "$QUAYD_A" | tee -a "$log"
  run_one B "$QUAYD_B" | tee -a "$log"
done
for label in A B; do
  printf 'MEDIAN %s' "$label"
  for f in conf_p50_ms conf_p99_ms conf_max_ms; do
    printf ' %s=%s' "$f" "$(grep "^RUN $label " "$log" | sed -n "s/.* $f=\([0-9]*\).*/\1/p" | median)"
  done
  echo
done
rm -f "$log"
