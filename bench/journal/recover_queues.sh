#!/usr/bin/env bash
# bench/journal/recover_queues.sh -- A/B of journal_recover alone (recover_queues.c) over
# QUEUES queues sharing MESSAGES persistent messages: the recovery code of tree A
# (A_ROOT, default ../main) against tree B's (B_ROOT, default this one), each built with
# -O2 straight from its src/store and src/lib (as run.sh builds recover_bench), taking
# turns (AB, BA, ...) for PAIRS pairs on one log that A writes first (on the repo's file
# system, page cache warm). Prints every run (wall and CPU seconds of the recovery, MB read),
# then the medians and the load average.
# Usage: bench/journal/recover_queues.sh [queues=1000] [messages=100000] [blob_size=1024]
#        PAIRS=7 A_ROOT=... B_ROOT=... BENCH_OUT=build/bench-journal
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
A_ROOT=${A_ROOT:-$ROOT/../main}
B_ROOT=${B_ROOT:-$ROOT}
OUT=${BENCH_OUT:-$ROOT/build/bench-journal}
PAIRS=${PAIRS:-7}
QUEUES=${1:-1000} MESSAGES=${2:-100000} SIZE=${3:-1024}
mkdir -p "$OUT"
for side in A B; do
  tree=A_ROOT; [ "$side" = B ] && tree=B_ROOT
  cc -std=c17 -O2 -g -D_GNU_SOURCE -I"${!tree}/src" -Wall -Wextra -Wno-unused-parameter \
     "${!tree}"/src/store/*.c "${!tree}"/src/lib/*.c "$ROOT/bench/journal/recover_queues.c" \
     -o "$OUT/recover_queues.$side" $(pkg-config --cflags --libs libuv) -lpthread -lm
done
DATA=$OUT/queues-data
rm -rf "$DATA"; mkdir -p "$DATA"
"$OUT/recover_queues.A" "$DATA" "$QUEUES" "$MESSAGES" "$SIZE" 0
echo "# $QUEUES queues, $MESSAGES messages of $SIZE B: $(du -sm "$DATA" | cut -f1) MB; A=$A_ROOT B=$B_ROOT"
declare -A runs=([A]="" [B]="") cpus=([A]="" [B]="")
for pair in $(seq "$PAIRS"); do
  order="A B"; [ $((pair % 2)) = 0 ] && order="B A"
  for side in $order; do
    line=$("$OUT/recover_queues.$side" "$DATA" "$QUEUES" "$MESSAGES" "$SIZE" 1)
    echo "$line pair=$pair build=$side load=$(cut -d' ' -f1 /proc/loadavg)"
    runs[$side]+="$(echo "$line" | sed -n 's/.*recover_s=\([^ ]*\).*/\1/p') "
    cpus[$side]+="$(echo "$line" | sed -n 's/.*cpu_s=\([^ ]*\).*/\1/p') "
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for what in runs cpus; do
  declare -n got=$what
  a=$(echo "${got[A]}" | median); b=$(echo "${got[B]}" | median)
  label=recover_s; [ "$what" = cpus ] && label=cpu_s
  echo "MEDIAN $label A=$a B=$b B/A=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", b/a}')"
done
echo "LOAD $(cat /proc/loadavg)"
rm -rf "$DATA"
