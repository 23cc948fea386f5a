#!/usr/bin/env bash
# bench/instr_count.sh -- a quayd's instructions for N messages through one queue, counted
# under callgrind (deterministic where msg/s is not: a 16 B row is bimodal on 2 cores).
#
#   bench/instr_count.sh QUAYD [PORT] [SIZE] [N]     e.g. bench/instr_count.sh build/quayd 5998 16 100000
#
# Starts QUAYD under valgrind --tool=callgrind, runs amqpbench -s SIZE --auto-ack -n N
# through it, stops it, and prints its instruction total (its start and stop included:
# compare two builds with the same N).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
QUAYD=$1; PORT=${2:-5998}; SIZE=${3:-16}; N=${4:-100000}
AMQPBENCH=${AMQPBENCH:-$HERE/build/bench/amqpbench}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$D/cg.out" "$QUAYD" --listen "127.0.0.1:$PORT" \
    --data "$D/data" >"$D/vg.log" 2>&1 &
P=$!
for _ in $(seq 1 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.2; done
"$AMQPBENCH" -p "$PORT" -s "$SIZE" --auto-ack -n "$N" >/dev/null
kill -TERM "$P"; wait "$P" 2>/dev/null || true
echo "quayd=$QUAYD size=$SIZE n=$N instructions=$(awk '/^(summary|totals):/ {print $2; exit}' "$D/cg.out")"
