#!/usr/bin/env bash
# tests/crash/soak.sh [MINUTES] -- soak the kill -9 crash test for MINUTES (default 15).
#
# Loops tests/integration/12-crash-kill9.py (publish with confirms, SIGKILL quayd at a random
# moment, restart on the same data, drain, check: every confirmed message delivered, no acked
# message back, nothing invented or duplicated) with a fresh seed and data dir per iteration,
# until the time is up. Each iteration runs ROUNDS kill/restart rounds (default 50), fewer
# when the time left is short (sized from the seconds per round measured so far), so the whole
# soak ends within MINUTES plus at most about one round.
#
# Builds nothing: uses $QUAYD, else build/quayd. Prints one line per iteration and a total
# (rounds, published, confirmed, delivered, lost=0, unconfirmed delivered). Exits 1 on the
# first failure (loss, resurrected ack, duplicate, quayd not restarting...), keeping that
# iteration's data dir and quayd.log (the path is printed); 2 on a usage/setup error.
#
# Environment: QUAYD=build/quayd  ROUNDS=50 (per iteration)  PYTHON=python3
#              SOAK_DIR=/tmp (where the work dir quay-soak.XXXXXX is created)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MINUTES=${1:-15}
ROUNDS=${ROUNDS:-50}
PYTHON=${PYTHON:-python3}
TEST=$ROOT/tests/integration/12-crash-kill9.py
QUAYD=${QUAYD:-$ROOT/build/quayd}

case "$MINUTES" in ''|*[!0-9.]*) echo "usage: $0 [MINUTES]" >&2; exit 2 ;; esac
case "$ROUNDS" in ''|*[!0-9]*|0) echo "soak: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
if [ ! -x "$QUAYD" ]; then echo "soak: $QUAYD is not an executable (build it, or set QUAYD)" >&2; exit 2; fi
QUAYD=$(cd "$(dirname "$QUAYD")" && pwd)/$(basename "$QUAYD")
[ -f "$TEST" ] || { echo "soak: $TEST missing" >&2; exit 2; }

WORK=$(mktemp -d "${SOAK_DIR:-/tmp}/quay-soak.XXXXXX")
CHILD=""      # process group of the running iteration (setsid: python3 and the quayd it started)
KEEP=0
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null; then
    kill -TERM -- "-$CHILD" 2>/dev/null || true
    sleep 1
    kill -KILL -- "-$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
  fi
  if [ "$KEEP" = 1 ]; then echo "soak: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'echo "soak: interrupted"; KEEP=1; exit 130' INT TERM

now() { date +%s.%N; }
calc() { awk "BEGIN{ printf \"%.3f\\n\", $* }"; }

START=$(now)
DEADLINE=$(calc "$START + $MINUTES * 60")
SPR=3          # seconds per round, estimate; refined after each iteration
iter=0 tot_rounds=0 tot_pub=0 tot_conf=0 tot_deliv=0 tot_unconf=0

echo "soak: $MINUTES min of $(basename "$TEST") ($ROUNDS rounds per iteration), quayd $QUAYD, work dir $WORK"
while :; do
  left=$(calc "$DEADLINE - $(now)")
  # rounds that fit in the time left (at least one round's worth must be left to start)
  n=$(awk -v l="$left" -v s="$SPR" -v r="$ROUNDS" 'BEGIN{ n = int(l / s); if (n > r) n = r; print n }')
  [ "$n" -ge 1 ] || break
  iter=$((iter + 1))
  seed=$(( (RANDOM << 15 | RANDOM) ))
  idir=$WORK/iter-$iter
  mkdir -p "$idir"
  log=$idir/output.txt
  t0=$(now)
  # own session/process group, temp dirs (the test's data dir and quayd.log) inside $idir
  TMPDIR=$idir QUAYD=$QUAYD SEED=$seed setsid "$PYTHON" "$TEST" "$n" >"$log" 2>&1 &
  CHILD=$!
  # bounded: the time left plus 2 minutes of grace, then the whole group is killed
  limit=$(calc "$left + 120")
  rc=0 timed_out=0
  while kill -0 "$CHILD" 2>/dev/null; do
    if awk -v a="$(now)" -v b="$t0" -v l="$limit" 'BEGIN{ exit !(a - b > l) }'; then
      timed_out=1
      kill -TERM -- "-$CHILD" 2>/dev/null || true; sleep 1; kill -KILL -- "-$CHILD" 2>/dev/null || true
      break
    fi
    sleep 0.5
  done
  wait "$CHILD" || rc=$?
  CHILD=""
  el=$(calc "$(now) - $t0")
  line=$(grep '^ok crash_rounds:' "$log" || true)
  if [ "$rc" != 0 ] || [ "$timed_out" = 1 ] || [ -z "$line" ]; then
    KEEP=1
    echo "soak: iteration $iter FAILED (seed $seed, $n rounds, rc=$rc$( [ "$timed_out" = 1 ] && echo ", killed after ${limit}s"))"
    sed 's/^/  | /' "$log" | tail -20
    echo "soak: re-run with: SEED=$seed QUAYD=$QUAYD $PYTHON $TEST $n   (data and logs: $idir)"
    echo "soak: FAIL after $iter iteration(s), $tot_rounds rounds passed before this one"
    exit 1
  fi
  # ok crash_rounds: R rounds in Ts, P published, C confirmed, D delivered, 0 lost, U unconfirmed delivered (allowed)
  read -r r pub conf deliv lost unconf < <(sed -E 's/^ok crash_rounds: ([0-9]+) rounds in [0-9.]+s, ([0-9]+) published, ([0-9]+) confirmed, ([0-9]+) delivered, ([0-9]+) lost, ([0-9]+) unconfirmed.*/\1 \2 \3 \4 \5 \6/' <<<"$line")
  if [ "$lost" != 0 ]; then KEEP=1; echo "soak: iteration $iter reports lost=$lost: $line"; exit 1; fi
  tot_rounds=$((tot_rounds + r)) tot_pub=$((tot_pub + pub)) tot_conf=$((tot_conf + conf))
  tot_deliv=$((tot_deliv + deliv)) tot_unconf=$((tot_unconf + unconf))
  SPR=$(awk -v e="$el" -v r="$r" 'BEGIN{ printf "%.2f", e / r }')
  printf "soak: iteration %d seed %d: %d rounds in %.1fs, %d published, %d confirmed, %d delivered, lost=0, %d unconfirmed delivered\n" \
    "$iter" "$seed" "$r" "$el" "$pub" "$conf" "$deliv" "$unconf"
  rm -rf "$idir"
done
total=$(calc "$(now) - $START")
printf "soak: total: %d iterations, %d rounds in %.0fs, %d published, %d confirmed, %d delivered, lost=0, %d unconfirmed delivered\n" \
  "$iter" "$tot_rounds" "$total" "$tot_pub" "$tot_conf" "$tot_deliv" "$tot_unconf"
if [ "$iter" = 0 ]; then echo "soak: no time for a single round"; exit 1; fi
echo "soak: ok"
