#!/usr/bin/env bash
# bench/journal/run.sh -- build and run the journal benchmark (recover_bench.c).
# Builds with -O2 straight from src/store and src/lib (no CMake, so it runs even when
# other folders do not build), into $BENCH_OUT (default build/bench-journal), and runs it on
# a data dir on the repo's own file system ($BENCH_DIR, default $BENCH_OUT/data, wiped).
# Usage: bench/journal/run.sh [messages=1000000] [blob_size=1024]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${BENCH_OUT:-$ROOT/build/bench-journal}
DATA=${BENCH_DIR:-$OUT/data}
mkdir -p "$OUT"
cc -std=c17 -O2 -g -D_GNU_SOURCE -I"$ROOT/src" -Wall -Wextra -Wno-unused-parameter \
   "$ROOT"/src/store/*.c "$ROOT"/src/lib/*.c "$ROOT/bench/journal/recover_bench.c" \
   -o "$OUT/recover_bench" $(pkg-config --cflags --libs libuv) -lpthread -lm
rm -rf "$DATA"
mkdir -p "$DATA"
df -h "$DATA" | tail -1 | awk '{print "disk: " $1 " (" $2 ") mounted on " $6}'
"$OUT/recover_bench" "$DATA" "$@"
rm -rf "$DATA"
