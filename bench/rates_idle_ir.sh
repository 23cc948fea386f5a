#!/usr/bin/env bash
# bench/rates_idle_ir.sh: the instructions a quayd executes in IDLE_S seconds of idle holding
# QUEUES queues (issue 20, item 1's cost), counted by callgrind with its instrumentation on
# for those seconds only: deterministic, unlike CPU time on a shared machine.
#
#   bench/rates_idle_ir.sh /tmp/base-quayd; bench/rates_idle_ir.sh build/quayd
#
# Needs valgrind and build/bench/quayscale (bench/rates_idle.sh or bench/run.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?quayd binary}
PORT=${PORT:-5982}
QUEUES=${QUEUES:-50000}
IDLE_S=${IDLE_S:-20}
TMP=$(mktemp -d /tmp/rates-idle-ir.XXXXXX)
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/out" "$BIN" \
  --listen "127.0.0.1:$PORT" --data "$TMP/data" >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 300); do
  ss -ltn | grep -q ":$PORT " && break
  sleep 0.1
done
build/bench/quayscale queues -p "$PORT" -n "$QUEUES" --keep >/dev/null 2>&1
sleep 8
callgrind_control -i on "$PID" >/dev/null
sleep "$IDLE_S"
callgrind_control -i off "$PID" >/dev/null
kill -TERM "$PID"
wait "$PID" || true
total=$(sed -n 's/^totals: *//p' "$TMP/out" | head -1)
echo "$(basename "$BIN") queues=$QUEUES idle_s=$IDLE_S instructions=$total per_s=$((total / IDLE_S))"
rm -rf "$TMP"
