#!/usr/bin/env bash
# bench/confirm_ir.sh: the instructions a quayd executes per confirmed message (publish with
# confirms, consume with acks, one broker), counted by callgrind with its instrumentation on
# while quaybench runs: deterministic up to batching, unlike CPU time on a shared machine.
# An A/B of the confirm path (e.g. the channel's confirm FIFO) that load cannot blur.
#
#   bench/confirm_ir.sh /tmp/base-quayd; bench/confirm_ir.sh build/quayd
#   PERSISTENT=1 bench/confirm_ir.sh build/quayd     (persistent messages, durable queue)
#
# Needs valgrind and build/bench/quaybench (bench/run.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?quayd binary}
PORT=${PORT:-5983}
COUNT=${COUNT:-100000}
PERSISTENT=${PERSISTENT:-0}
TMP=$(mktemp -d /tmp/confirm-ir.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/out" "$BIN" \
  --listen "127.0.0.1:$PORT" --data "$TMP/data" >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 300); do
  ss -ltn | grep -q ":$PORT " && break
  sleep 0.1
done
flags=(-p "$PORT" -s 1024 --confirm -w 1000 --prefetch 100 -n "$COUNT")
[ "$PERSISTENT" = 1 ] && flags+=(--persistent --durable)
build/bench/quaybench "${flags[@]}" -n 1000 >/dev/null 2>&1   # warm up (queue, pools)
callgrind_control -i on "$PID" >/dev/null 2>&1
build/bench/quaybench "${flags[@]}" >"$TMP/bench" 2>&1
callgrind_control -i off "$PID" >/dev/null 2>&1
kill -TERM "$PID"
wait "$PID" || true
total=$(sed -n 's/^totals: *//p' "$TMP/out" | head -1)
check=$(grep -o 'lost=[0-9-]* dup=[0-9-]*' "$TMP/bench" | head -1)
echo "$BIN persistent=$PERSISTENT" \
  "messages=$COUNT instructions=$total per_message=$((total / COUNT)) $check"
