#!/usr/bin/env bash
# tests/crash/run.sh -- soak the journal crash test with many seeds (see README.md).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${BIN:-$ROOT/build-asan/tests/test_journal_crash}
RUNS=${1:-20}
ROUNDS=${2:-3000}
for i in $(seq 1 "$RUNS"); do
    seed=$(( (RANDOM << 15 | RANDOM) * 1000 ))
    if ! QUAY_CRASH_SEED=$seed QUAY_CRASH_ROUNDS=$ROUNDS "$BIN" >/tmp/quay-crash.$$ 2>&1; then
        grep -E "crash test failed" /tmp/quay-crash.$$ || tail -20 /tmp/quay-crash.$$
        echo "FAILED: seeds $seed .. $((seed + ROUNDS - 1))"
        rm -f /tmp/quay-crash.$$
        exit 1
    fi
    echo "ok: seeds $seed .. $((seed + ROUNDS - 1))"
done
rm -f /tmp/quay-crash.$$
