#!/usr/bin/env bash
# bench/neighbour_ab.sh QUAYD [PORT]: issue 18's neighbour row by hand, for an
# A/B of two builds run in turn: one quayd on a fresh data directory; the
# confirm pair (quaybench -s 1024 --confirm -w 1000 --prefetch 100) for 8 s
# alone, then beside a flooder (quaybench -P 1 -C 0 -s 1024: a queue nobody
# consumes) for 8 s. Prints the pair's rate alone and beside, and the
# flooder's. Needs build/bench/quaybench (bench/run.sh builds it).
set -euo pipefail
quayd=$1
port=${2:-5961}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=$(mktemp -d /tmp/quay-neighbour.XXXXXX)
"$quayd" --listen "127.0.0.1:$port" --data "$dir/data" >"$dir/log" 2>&1 &
qpid=$!
trap 'kill $qpid 2>/dev/null; wait $qpid 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
pair() {
  build/bench/quaybench -p "$port" -s 1024 --confirm -w 1000 --prefetch 100 -d 8 \
      --prefix "$1" 2>&1 | grep -o "pub_rate=[0-9]*" | cut -d= -f2
}
alone=$(pair pa)
build/bench/quaybench -p "$port" -P 1 -C 0 -s 1024 -d 10 --prefix fl >"$dir/flood" 2>&1 &
fpid=$!
sleep 0.5
beside=$(pair pb)
wait $fpid || true
flood=$(grep -o "pub_rate=[0-9]*" "$dir/flood" | cut -d= -f2)
echo "NEIGHBOUR quayd=$quayd alone=$alone beside=$beside kept=$(awk -v a="$alone" -v b="$beside" 'BEGIN {printf "%.2f", b / a}') flood=$flood"
