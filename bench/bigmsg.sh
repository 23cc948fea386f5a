#!/usr/bin/env bash
# bench/bigmsg.sh: large messages (issue 18 item 2), in one interleaved run:
#   tcppump stream (one loopback hop, no broker: the ceiling; a broker's
#   bytes cross two hops, so the two-hop ceiling is half its rate),
#   RabbitMQ (shared/bench/run-rabbitmq.sh, port 5701), and one or two quayd
#   builds (A/B), each row `amqpbench -s SIZE --auto-ack -d DURATION --check
#   --watch-pid PID`. Every rep runs tcppump, RabbitMQ, quay A, quay B in turn.
#
#   QUAYD_A=/tmp/base-quayd QUAYD_B=build/quayd SIZES="65536 1048576" REPS=5 bench/bigmsg.sh
#   QUAYD_ARGS="--read-batch-us 0" ... (extra quayd options for both)
#   RABBIT=0 (skip RabbitMQ), TCPPUMP=0 (skip tcppump)
#   ROW_ARGS="--confirm -w 1000 --prefetch 100" (amqpbench options instead
#   of --auto-ack: the A/B of the 1 KiB rows uses the same script)
#
# Prints one line per run and a summary of medians: msg/s, broker CPU µs
# per message (srv_cpu_pct/100 x elapsed_s / consumed x 1e6).
# Needs: /tmp/quay-bench/{amqpbench,tcppump} (make -f ../shared/bench/Makefile
# OUT=/tmp/quay-bench), rabbitmq-server (scripts/setup.sh --bench).
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$HERE/../shared/bench}
[ -d "$SHARED" ] || SHARED=/work/shared/bench
TOOLS=${TOOLS:-/tmp/quay-bench}
QUAYD_A=${QUAYD_A:-$HERE/build/quayd}
QUAYD_B=${QUAYD_B:-}
QUAYD_ARGS=${QUAYD_ARGS:-}
SIZES=${SIZES:-65536 1048576}
REPS=${REPS:-5}
DURATION=${DURATION:-10}
RABBIT=${RABBIT:-1}
TCPPUMP=${TCPPUMP:-1}
ROW_ARGS=${ROW_ARGS:---auto-ack}
PORT_A=${PORT_A:-5921}
PORT_B=${PORT_B:-5922}
OUT=${OUT:-$HERE/build/bench/bigmsg-$(date +%Y%m%d-%H%M%S).txt}

[ -x "$TOOLS/amqpbench" ] && [ -x "$TOOLS/tcppump" ] || make -f "$SHARED/Makefile" OUT="$TOOLS" >/dev/null
mkdir -p "$(dirname "$OUT")"
TMP=$(mktemp -d /tmp/bigmsg.XXXXXX)
PIDS=()
export RMQ_BENCH_DIR=$TMP/rmq
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ "$RABBIT" = 1 ] && "$SHARED/run-rabbitmq.sh" stop >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
trap cleanup EXIT

start_quay() { # $1 binary, $2 port -> pid on stdout
  mkdir -p "$TMP/data-$2"
  # shellcheck disable=SC2086
  "$1" --listen "127.0.0.1:$2" --data "$TMP/data-$2" $QUAYD_ARGS >"$TMP/quay-$2.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do ss -ltnH "sport = :$2" | grep -q . && break; sleep 0.05; done
  echo "$pid"
}

declare -A PID PORT
BROKERS=()
if [ "$RABBIT" = 1 ]; then
  "$SHARED/run-rabbitmq.sh" start 1 >/dev/null
  PID[rabbitmq]=$("$SHARED/run-rabbitmq.sh" pid 1); PORT[rabbitmq]=5701; BROKERS+=(rabbitmq)
fi
PID[quayA]=$(start_quay "$QUAYD_A" "$PORT_A"); PIDS+=("${PID[quayA]}"); PORT[quayA]=$PORT_A; BROKERS+=(quayA)
if [ -n "$QUAYD_B" ]; then
  PID[quayB]=$(start_quay "$QUAYD_B" "$PORT_B"); PIDS+=("${PID[quayB]}"); PORT[quayB]=$PORT_B; BROKERS+=(quayB)
fi

field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<" $1"; }
median() { sort -g | awk '{a[NR]=$1} END{if(NR==0)exit; print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }

echo "# $(date -u +%FT%TZ) $(uptime) A=$QUAYD_A B=${QUAYD_B:-none} sizes=[$SIZES] reps=$REPS d=$DURATION row=[$ROW_ARGS]" | tee -a "$OUT"
for size in $SIZES; do
  for rep in $(seq "$REPS"); do
    if [ "$TCPPUMP" = 1 ]; then
      line=$("$TOOLS/tcppump" stream -s "$size" -d "$DURATION" -b 1 | grep '^RESULT')
    else
      line="RESULT msg_rate=0"
    fi
    echo "size=$size rep=$rep broker=tcppump $line" | tee -a "$OUT"
    for b in "${BROKERS[@]}"; do
      # shellcheck disable=SC2086
      line=$("$TOOLS/amqpbench" -p "${PORT[$b]}" -s "$size" $ROW_ARGS -d "$DURATION" --check \
               --watch-pid "${PID[$b]}" 2>/dev/null | grep '^RESULT' || echo "RESULT status=error")
      cpu=$(awk -v c="$(field "$line" srv_cpu_pct)" -v e="$(field "$line" elapsed_s)" \
                -v n="$(field "$line" consumed)" 'BEGIN{if(n>0)printf "%.1f", c/100*e/n*1e6}')
      echo "size=$size rep=$rep broker=$b us_per_msg=$cpu load=$(cut -d' ' -f1 /proc/loadavg) $line" | tee -a "$OUT"
    done
  done
done

echo
echo "== medians (raw: $OUT)"
printf "%-9s %-9s %12s %12s %10s %8s\n" size broker "msg/s" "us/msg" "lost+dup" runs
for size in $SIZES; do
  L=$(grep "^size=$size " "$OUT" | tail -n $((REPS * (1 + ${#BROKERS[@]}))))
  tp=$(grep 'broker=tcppump' <<<"$L" | sed -n 's/.*msg_rate=\([0-9.]*\).*/\1/p' | median)
  printf "%-9s %-9s %12s %12s %10s %8s   two-hop ceiling %s\n" "$size" tcppump "$tp" "" "" \
    "$(grep -c 'broker=tcppump' <<<"$L")" "$(awk -v t="$tp" 'BEGIN{printf "%.0f", t/2}')"
  for b in "${BROKERS[@]}"; do
    B=$(grep "broker=$b " <<<"$L")
    rate=$(sed -n 's/.* cons_rate=\([0-9.]*\).*/\1/p' <<<"$B" | median)
    us=$(sed -n 's/.* us_per_msg=\([0-9.]*\).*/\1/p' <<<"$B" | median)
    bad=$(awk '{for(i=1;i<=NF;i++) if($i ~ /^(lost|dup|reordered)=/){split($i,a,"="); s+=a[2]}} END{print s+0}' <<<"$B")
    printf "%-9s %-9s %12s %12s %10s %8s   %s of two-hop ceiling\n" "$size" "$b" "$rate" "$us" "$bad" \
      "$(wc -l <<<"$B")" "$(awk -v r="$rate" -v t="$tp" 'BEGIN{if(t>0)printf "%.0f%%", 200*r/t}')"
  done
done
