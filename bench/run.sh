#!/usr/bin/env bash
# bench/run.sh -- quay against RabbitMQ, side by side, on this machine.
#
# Builds bench/quaybench, bench/quayscale and bench/fsync_latency into $BENCH_OUT (default
# build/bench), starts a private RabbitMQ node by hand (own node name, ports, epmd and
# directories under a temp dir; never systemd) and quayd, runs every selected row interleaved
# (RabbitMQ, quay, RabbitMQ, quay, ... REPS times), prints medians and quay/RabbitMQ ratios,
# and stops what it started.
# See bench/README.md.
#
# Usage: bench/run.sh [--quayd PATH] [--rows LIST] [--reps N] [--duration S] [--no-quay] [--no-rabbitmq]
# Environment (same meaning as the options, options win):
#   QUAYD=build/quayd  QUAYD_ARGS=  ROWS=default  REPS=3  DURATION=10
#   SCALE_QUEUES=50000 SCALE_CONNS=5000 SCALE_REPS=1 IDLE_SETTLE=5
#   RMQ_PORT=5791 QUAY_PORT=5792 BENCH_EPMD_PORT=25891 (RabbitMQ distribution: +1, rabbitmqctl: +2..+9)
#   RMQ_TLS_PORT=5793 QUAY_TLS_PORT=5794 (AMQPS listeners, opened only for the tls row)
#   RMQ_HOME=/usr/lib/rabbitmq/lib/rabbitmq_server-*  BENCH_OUT=build/bench  KEEP_TMP=0
#   FSYNC_ROUNDS=1000
#   PRETOUCH_GIB=0 (touch this much memory once before the rows: on a fresh VM the host backs
#     guest memory on first touch, ~5x slower than memory touched before, and rows whose broker
#     heap grows, neighbour and memory-flood, then measure that; bench/RESULTS.md, "A flooder's turn")
#   RECOVERY_MESSAGES=1000000 RECOVERY_PUBLISHERS=4 RECOVERY_RABBIT=1 RECOVERY_TIMEOUT=900
#   MEMFLOOD_MARK=200MiB MEMFLOOD_DURATION=20 MEMFLOOD_PUBLISHERS=4 MEMFLOOD_RABBIT=1
# ROWS: space/comma separated names, or "default", "all", "throughput", "scale":
#   1k 16b 64k confirm confirm-ack10 4x4 latency   (default throughput rows)
#   persistent latency-persistent                  (extra rows, in "all")
#   ttl-dlx (= ttl-dlx-args ttl-dlx-dead)          (extra rows, in "all")
#   recovery memory-flood                          (restart the brokers; in "all", run last)
#   tls                                            (the confirm row over plain TCP and over AMQPS)
#   idle queues conns                              (scale rows)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

QUAYD=${QUAYD:-build/quayd}
QUAYD_ARGS=${QUAYD_ARGS:-}
ROWS=${ROWS:-default}
REPS=${REPS:-3}
DURATION=${DURATION:-10}
SCALE_QUEUES=${SCALE_QUEUES:-50000}
SCALE_CONNS=${SCALE_CONNS:-5000}
SCALE_REPS=${SCALE_REPS:-1}
IDLE_SETTLE=${IDLE_SETTLE:-5}
RMQ_PORT=${RMQ_PORT:-5791}
QUAY_PORT=${QUAY_PORT:-5792}
BENCH_EPMD_PORT=${BENCH_EPMD_PORT:-25891}
BENCH_OUT=${BENCH_OUT:-build/bench}
KEEP_TMP=${KEEP_TMP:-0}
FSYNC_ROUNDS=${FSYNC_ROUNDS:-1000}
RECOVERY_MESSAGES=${RECOVERY_MESSAGES:-1000000}
RECOVERY_PUBLISHERS=${RECOVERY_PUBLISHERS:-4}
RECOVERY_RABBIT=${RECOVERY_RABBIT:-1}
RECOVERY_TIMEOUT=${RECOVERY_TIMEOUT:-900}
MEMFLOOD_MARK=${MEMFLOOD_MARK:-200MiB}
MEMFLOOD_DURATION=${MEMFLOOD_DURATION:-20}
MEMFLOOD_PUBLISHERS=${MEMFLOOD_PUBLISHERS:-4}
NEIGHBOUR_FLOOD_RATE=${NEIGHBOUR_FLOOD_RATE:-0}   # the flooder's msg/s in the neighbour row (0: unlimited)
MEMFLOOD_RABBIT=${MEMFLOOD_RABBIT:-1}
RMQ_TLS_PORT=${RMQ_TLS_PORT:-5793}
QUAY_TLS_PORT=${QUAY_TLS_PORT:-5794}
USE_QUAY=1
USE_RMQ=1

while [ $# -gt 0 ]; do
  case "$1" in
    --quayd) QUAYD=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --no-quay) USE_QUAY=0; shift ;;
    --no-rabbitmq) USE_RMQ=0; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -z "${RMQ_HOME:-}" ]; then
  RMQ_HOME=$(ls -d /usr/lib/rabbitmq/lib/rabbitmq_server-* 2>/dev/null | sort -V | tail -1 || true)
fi

DEFAULT_ROWS="1k 16b 64k confirm confirm-ack10 4x4 latency idle queues conns"
THROUGHPUT_ROWS="1k 16b 64k confirm confirm-ack10 4x4 latency persistent latency-persistent ttl-dlx-args ttl-dlx-dead"
SCALE_ROWS="idle queues conns"
RESTART_ROWS="recovery memory-flood"   # rows that start their own brokers (run after all others)
case "$ROWS" in
  default) ROWS=$DEFAULT_ROWS ;;
  all) ROWS="$THROUGHPUT_ROWS $SCALE_ROWS $RESTART_ROWS" ;;
  throughput) ROWS="1k 16b 64k confirm confirm-ack10 4x4 latency" ;;
  scale) ROWS=$SCALE_ROWS ;;
esac
ROWS=${ROWS//,/ }
_rows=""
for r in $ROWS; do
  case "$r" in ttl-dlx) _rows+=" ttl-dlx-args ttl-dlx-dead" ;; *) _rows+=" $r" ;; esac
done
ROWS=${_rows# }

# ------------------------------------------------------------------------------ rows
row_args() {
  case "$1" in
    1k)                 echo "-s 1024 --auto-ack" ;;
    16b)                echo "-s 16 --auto-ack" ;;
    64k)                echo "-s 65536 --auto-ack" ;;
    confirm)            echo "-s 1024 --confirm -w 1000 --prefetch 100" ;;
    confirm-ack10)      echo "-s 1024 --confirm -w 1000 --prefetch 100 --multi-ack 10" ;;
    4x4)                echo "-s 1024 -P 4 -C 4 --queues 4 --auto-ack" ;;
    latency)            echo "-s 1024 --rate 1000 --confirm -w 1000 --prefetch 100" ;;
    persistent)         echo "-s 1024 --confirm -w 1000 --prefetch 100 --persistent --durable" ;;
    latency-persistent) echo "-s 1024 --rate 1000 --confirm -w 1000 --prefetch 100 --persistent --durable" ;;
    ttl-dlx-args)       echo "-s 1024 --confirm -w 1000 --prefetch 100 --qarg x-message-ttl=60000 --dlx qb-ttl-dlx" ;;
    ttl-dlx-dead)       echo "-s 1024 --confirm -w 1000 --prefetch 100 --qarg x-message-ttl=0 --dlx qb-dlx --consume-queue qb-dlx-target" ;;
    *) return 1 ;;
  esac
}
row_desc() {
  case "$1" in
    1k)                 echo "1 KiB, auto-ack, 1 producer / 1 consumer" ;;
    16b)                echo "16 B, auto-ack" ;;
    64k)                echo "64 KiB, auto-ack" ;;
    confirm)            echo "1 KiB, confirms (window 1000), manual single acks, prefetch 100" ;;
    confirm-ack10)      echo "1 KiB, confirms (window 1000), acks every 10 (multiple), prefetch 100" ;;
    4x4)                echo "1 KiB, 4 producers / 4 consumers on 4 queues, auto-ack" ;;
    latency)            echo "latency at a fixed 1000 msg/s, 1 KiB, confirms, manual acks, prefetch 100" ;;
    persistent)         echo "1 KiB persistent to a durable queue, confirms, manual acks, prefetch 100" ;;
    latency-persistent) echo "latency at 1000 msg/s, persistent + durable, confirms, manual acks" ;;
    ttl-dlx-args)       echo "as confirm, queue has x-message-ttl=60000 + x-dead-letter-exchange (nothing expires)" ;;
    ttl-dlx-dead)       echo "as confirm, queue has x-message-ttl=0 + DLX (fanout) -> every message dead-lettered to a consumed queue" ;;
    recovery)           echo "restart with $RECOVERY_MESSAGES persistent 1 KiB messages in a durable queue: s until a passive declare sees them all" ;;
    tls)                echo "the confirm row (1 KiB, confirms, prefetch 100) over plain TCP and over AMQPS (TLS 1.3), same broker" ;;
    neighbour)          echo "the confirm row's pair, alone and beside a publisher flooding a queue without consumers (rate ${NEIGHBOUR_FLOOD_RATE:-0}, 0 = unlimited)" ;;
    memory-flood)       echo "$MEMFLOOD_PUBLISHERS publishers flood 1 KiB (confirms, no consumer) for ${MEMFLOOD_DURATION}s at a memory mark of $MEMFLOOD_MARK: peak RSS / mark" ;;
    idle)               echo "idle broker: RSS after start (+${IDLE_SETTLE}s), time until the AMQP port opens" ;;
    queues)             echo "$SCALE_QUEUES classic queues, one amq.direct binding each: declares/s, RSS per queue" ;;
    conns)              echo "$SCALE_CONNS idle connections with one channel each: RSS per connection" ;;
  esac
}
for r in $ROWS; do
  case "$r" in idle|queues|conns|recovery|memory-flood|neighbour|tls) ;; *) row_args "$r" >/dev/null || { echo "run.sh: unknown row '$r'" >&2; exit 2; } ;; esac
done
mark_bytes() { # 200MiB, 1GiB, 500MB, 1048576 -> bytes
  awk -v s="$1" 'BEGIN{ n = s + 0; u = substr(s, length(n "") + 1);
    f["" ] = 1; f["B"] = 1; f["kB"] = 1e3; f["KiB"] = 1024; f["MB"] = 1e6; f["MiB"] = 1048576; f["GB"] = 1e9; f["GiB"] = 1073741824;
    if (!(u in f)) exit 1; printf "%.0f", n * f[u] }'
}
MEMFLOOD_MARK_BYTES=$(mark_bytes "$MEMFLOOD_MARK") || { echo "run.sh: MEMFLOOD_MARK=$MEMFLOOD_MARK: use e.g. 200MiB" >&2; exit 2; }

# ------------------------------------------------------------------------------ build
mkdir -p "$BENCH_OUT"
CC=${CC:-cc}
BENCH_CFLAGS="-O2 -g -std=c17 -Wall -Wextra"
RMQC_FLAGS=$(pkg-config --cflags --libs librabbitmq 2>/dev/null || echo "-lrabbitmq")
for t in quaybench quayscale; do
  # shellcheck disable=SC2086
  $CC $BENCH_CFLAGS "bench/$t.c" -o "$BENCH_OUT/$t" $RMQC_FLAGS -lpthread
done
# shellcheck disable=SC2086
$CC $BENCH_CFLAGS bench/fsync_latency.c -o "$BENCH_OUT/fsync_latency"
QB=$BENCH_OUT/quaybench
QS=$BENCH_OUT/quayscale
FL=$BENCH_OUT/fsync_latency

# ------------------------------------------------------------------------------ state, cleanup
TMP=$(mktemp -d /tmp/quaybench.XXXXXX)
RESULTS=$BENCH_OUT/results-$(date +%Y%m%d-%H%M%S).txt
: > "$RESULTS"
RMQ_NODE=quaybench@localhost
RMQ_DIR=$TMP/rabbitmq
EPMD_PID="" RMQ_WRAPPER="" RMQ_PID="" RMQ_UP=0 RMQ_STARTUP_S="" RMQ_IDLE_KIB=""
QUAY_PID="" QUAY_UP=0 QUAY_STARTUP_S="" QUAY_IDLE_KIB="" QUAY_WHY=""
# set by the restart rows around rmq_start / quay_start:
RMQ_KEEP_DATA=0 RMQ_EXTRA_CONF="" RMQ_LAUNCH_T="" QUAY_KEEP_DATA=0 QUAY_EXTRA_ARGS="" QUAY_LAUNCH_T=""
# set when the tls row is selected (tls_setup): the AMQPS listeners of both brokers
RMQ_TLS_CONF="" QUAY_TLS_ARGS="" PKI=""
declare -A MED  # MED[row.broker.field] = median

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

port_listening() { [ -n "$(ss -ltnH "sport = :$1" 2>/dev/null)" ]; }

rmq_env() {
  export HOME=$RMQ_DIR/home
  export RABBITMQ_CONF_ENV_FILE=/nonexistent
  export RABBITMQ_NODENAME=$RMQ_NODE
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$RMQ_PORT
  export RABBITMQ_DIST_PORT=$((BENCH_EPMD_PORT + 1))
  export RABBITMQ_CTL_DIST_PORT_MIN=$((BENCH_EPMD_PORT + 2))
  export RABBITMQ_CTL_DIST_PORT_MAX=$((BENCH_EPMD_PORT + 9))
  export RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia
  export RABBITMQ_LOG_BASE=$RMQ_DIR/log
  export RABBITMQ_CONFIG_FILE=$RMQ_DIR/rabbitmq
  export RABBITMQ_ADVANCED_CONFIG_FILE=$RMQ_DIR/advanced.config
  export RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_DIR/enabled_plugins
  export RABBITMQ_PLUGINS_EXPAND_DIR=$RMQ_DIR/plugins-expand
  export RABBITMQ_FEATURE_FLAGS_FILE=$RMQ_DIR/feature_flags
  export RABBITMQ_PID_FILE=$RMQ_DIR/beam.pid
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_EPMD_PORT=$BENCH_EPMD_PORT
  export ERL_EPMD_ADDRESS=127.0.0.1
}
rmqctl() { ( rmq_env; "$RMQ_HOME/sbin/rabbitmqctl" -n "$RMQ_NODE" "$@" ); }

rmq_start() {
  RMQ_UP=0
  [ "$USE_RMQ" = 1 ] || return 0
  if [ -z "$RMQ_HOME" ] || [ ! -x "$RMQ_HOME/sbin/rabbitmq-server" ]; then log "RabbitMQ not found (RMQ_HOME)"; return 0; fi
  for p in "$RMQ_PORT" "$BENCH_EPMD_PORT" "$((BENCH_EPMD_PORT + 1))"; do
    if port_listening "$p"; then log "port $p is busy: set RMQ_PORT / BENCH_EPMD_PORT"; return 0; fi
  done
  mkdir -p "$RMQ_DIR/home" "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
  [ "$RMQ_KEEP_DATA" = 1 ] || rm -rf "$RMQ_DIR/mnesia"/*
  rm -f "$RMQ_DIR/beam.pid"
  cat > "$RMQ_DIR/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RMQ_PORT
log.file.level = warning
log.console = false
$RMQ_TLS_CONF
$RMQ_EXTRA_CONF
EOF
  echo '[].' > "$RMQ_DIR/enabled_plugins"
  echo '[].' > "$RMQ_DIR/advanced.config"
  # our own epmd, in the foreground of a background job so we know its pid
  epmd -address 127.0.0.1 -port "$BENCH_EPMD_PORT" >"$RMQ_DIR/log/epmd.log" 2>&1 &
  EPMD_PID=$!
  for _ in $(seq 50); do port_listening "$BENCH_EPMD_PORT" && break; sleep 0.1; done
  local t0; t0=$(date +%s.%N)
  RMQ_LAUNCH_T=$t0
  ( rmq_env; exec setsid "$RMQ_HOME/sbin/rabbitmq-server" >"$RMQ_DIR/log/stdout.log" 2>&1 </dev/null ) &
  RMQ_WRAPPER=$!
  for _ in $(seq $((${RMQ_START_TIMEOUT:-120} * 10))); do   # default up to 120 s
    if port_listening "$RMQ_PORT"; then break; fi
    kill -0 "$RMQ_WRAPPER" 2>/dev/null || break
    sleep 0.1
  done
  if ! port_listening "$RMQ_PORT"; then
    log "RabbitMQ did not start; see $RMQ_DIR/log"; tail -5 "$RMQ_DIR/log/stdout.log" >&2 || true
    rmq_stop; return 0
  fi
  RMQ_STARTUP_S=$(echo "$(date +%s.%N) - $t0" | bc)
  rmqctl -q await_startup --timeout 60 >/dev/null 2>&1 || rmqctl -q wait --timeout 60 "$RMQ_DIR/beam.pid" >/dev/null 2>&1 || true
  RMQ_PID=$(cat "$RMQ_DIR/beam.pid" 2>/dev/null || true)
  if [ -z "$RMQ_PID" ] || ! kill -0 "$RMQ_PID" 2>/dev/null; then
    RMQ_PID=$(ss -ltnpH "sport = :$RMQ_PORT" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
  fi
  RMQ_UP=1
  log "RabbitMQ up on 127.0.0.1:$RMQ_PORT (beam pid $RMQ_PID, port open after ${RMQ_STARTUP_S}s)"
}

rmq_stop() {
  if [ -n "$RMQ_PID" ] && kill -0 "$RMQ_PID" 2>/dev/null; then
    ( rmq_env; timeout "${RMQ_STOP_WAIT:-60}" "$RMQ_HOME/sbin/rabbitmqctl" -n "$RMQ_NODE" -q stop ) >/dev/null 2>&1 || true
    for _ in $(seq $((${RMQ_STOP_WAIT:-10} * 10))); do kill -0 "$RMQ_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$RMQ_PID" 2>/dev/null || true
  fi
  if [ -n "$RMQ_WRAPPER" ]; then
    kill "$RMQ_WRAPPER" 2>/dev/null || true; wait "$RMQ_WRAPPER" 2>/dev/null || true
  fi
  if [ -n "$EPMD_PID" ]; then
    kill "$EPMD_PID" 2>/dev/null || true; wait "$EPMD_PID" 2>/dev/null || true
  fi
  RMQ_PID="" RMQ_WRAPPER="" EPMD_PID="" RMQ_UP=0
}

quay_start() {
  QUAY_UP=0
  [ "$USE_QUAY" = 1 ] || { QUAY_WHY="disabled"; return 0; }
  if [ ! -x "$QUAYD" ]; then QUAY_WHY="$QUAYD not built"; log "quay: n/a ($QUAY_WHY)"; return 0; fi
  if port_listening "$QUAY_PORT"; then QUAY_WHY="port $QUAY_PORT busy"; log "quay: n/a ($QUAY_WHY)"; return 0; fi
  [ "$QUAY_KEEP_DATA" = 1 ] || rm -rf "$TMP/quay-data"
  mkdir -p "$TMP/quay-data"
  local t0; t0=$(date +%s.%N)
  QUAY_LAUNCH_T=$t0
  # shellcheck disable=SC2086
  "$QUAYD" --listen "127.0.0.1:$QUAY_PORT" --data "$TMP/quay-data" $QUAYD_ARGS $QUAY_TLS_ARGS $QUAY_EXTRA_ARGS >>"$TMP/quayd.log" 2>&1 &
  QUAY_PID=$!
  for _ in $(seq $((${QUAY_START_TIMEOUT:-30} * 10))); do   # default up to 30 s
    port_listening "$QUAY_PORT" && break
    kill -0 "$QUAY_PID" 2>/dev/null || break
    sleep 0.1
  done
  if ! kill -0 "$QUAY_PID" 2>/dev/null || ! port_listening "$QUAY_PORT"; then
    QUAY_WHY="quayd failed to start (log: $TMP/quayd.log)"
    log "quay: n/a ($QUAY_WHY)"; tail -5 "$TMP/quayd.log" >&2 || true
    quay_stop; KEEP_TMP=1; return 0
  fi
  QUAY_STARTUP_S=$(echo "$(date +%s.%N) - $t0" | bc)
  QUAY_UP=1
  log "quayd up on 127.0.0.1:$QUAY_PORT (pid $QUAY_PID, port open after ${QUAY_STARTUP_S}s)"
}

quay_stop() {
  if [ -n "$QUAY_PID" ]; then
    kill -TERM "$QUAY_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$QUAY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$QUAY_PID" 2>/dev/null || true
    wait "$QUAY_PID" 2>/dev/null || true
  fi
  QUAY_PID="" QUAY_UP=0
}

cleanup() {
  trap - EXIT INT TERM
  quay_stop
  rmq_stop
  if [ "$KEEP_TMP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

broker_up() { # $1 = rabbitmq|quay
  if [ "$1" = rabbitmq ]; then
    [ "$RMQ_UP" = 1 ] && kill -0 "$RMQ_PID" 2>/dev/null
  else
    if [ "$QUAY_UP" = 1 ] && ! kill -0 "$QUAY_PID" 2>/dev/null; then
      QUAY_UP=0; QUAY_WHY="quayd died (log: $TMP/quayd.log)"; KEEP_TMP=1; log "quay: $QUAY_WHY"
    fi
    [ "$QUAY_UP" = 1 ]
  fi
}
broker_port() { if [ "$1" = rabbitmq ]; then echo "$RMQ_PORT"; else echo "$QUAY_PORT"; fi; }
broker_pid() { if [ "$1" = rabbitmq ]; then echo "$RMQ_PID"; else echo "$QUAY_PID"; fi; }

start_brokers() { rmq_start; quay_start; }
restart_brokers() { quay_stop; rmq_stop; start_brokers; }

# ------------------------------------------------------------------------------ numbers
field() { # $1 = RESULT line, $2 = key
  sed -n "s/.*[ ]$2=\([^ ]*\).*/\1/p" <<<" $1" | head -1
}
col() { # values of key $1 from RESULT lines on stdin, skipping failed runs
  awk -v k="$1" '/status=error/ {next} { for (i = 1; i <= NF; i++) { n = index($i, "="); if (n && substr($i, 1, n - 1) == k) print substr($i, n + 1) } }'
}
median() { # values on stdin, one per line -> median ("" if none)
  sort -g | awk '{v[NR]=$1} END{ if (NR==0) exit; if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2 }'
}
fmt() { # $1 value, $2 printf format; "n/a" for empty / negative
  if [ -z "${1:-}" ] || awk -v v="$1" 'BEGIN{exit !(v<0)}'; then echo "n/a"; else printf "$2" "$1"; fi
}
ratio() { # quay / rabbitmq
  if [ -z "${1:-}" ] || [ -z "${2:-}" ]; then echo "n/a"; return; fi
  awk -v q="$1" -v r="$2" 'BEGIN{ if (q<0 || r<=0) print "n/a"; else printf "%.2f", q/r }'
}

# ------------------------------------------------------------------------------ throughput rows
run_tp_row() {
  local row=$1 args; args=$(row_args "$row")
  log "row $row: $(row_desc "$row")"
  local b rep out rc line
  declare -A lines=()
  for rep in $(seq "$REPS"); do
    for b in rabbitmq quay; do
      broker_up "$b" || continue
      out=$TMP/out.$row.$b.$rep
      rc=0
      # shellcheck disable=SC2086
      "$QB" -p "$(broker_port "$b")" --watch-pid "$(broker_pid "$b")" -d "$DURATION" --prefix "qb-$row" $args \
        >"$out" 2>"$out.err" || rc=$?
      line=$(grep '^RESULT ' "$out" | tail -1 || true)
      [ -n "$line" ] || line="RESULT status=error error=no_output"
      echo "row=$row broker=$b rep=$rep rc=$rc $line" >>"$RESULTS"
      log "  $b rep $rep: $(field "$line" cons_rate) msg/s p50 $(field "$line" lat_p50_us)us p99 $(field "$line" lat_p99_us)us" \
          "cpu $(field "$line" srv_cpu_us_per_msg)us/msg (broker $(field "$line" srv_cpu_pct)%, client $(field "$line" client_cpu_pct)%) rc=$rc $( [ "$rc" = 0 ] || head -c 300 "$out.err")"
      lines[$b]+="$line"$'\n'
    done
  done
  echo
  echo "== $row: $(row_desc "$row")"
  echo "   quaybench $args -d $DURATION  (median of $REPS)"
  printf "   %-14s %10s %9s %9s %11s %9s %9s  %s\n" broker "msg/s" "p50 us" "p99 us" "cpu us/msg" "RSS MiB" "client %" checks
  for b in rabbitmq quay; do
    local L=${lines[$b]:-} f
    if [ -z "$L" ]; then
      if [ "$b" = quay ]; then printf "   %-14s %10s   (%s)\n" quay n/a "${QUAY_WHY:-not running}"; else printf "   %-14s %10s\n" rabbitmq n/a; fi
      continue
    fi
    for f in cons_rate pub_rate lat_p50_us lat_p99_us srv_cpu_us_per_msg srv_rss_kib client_cpu_pct conf_p50_us conf_p99_us; do
      MED[$row.$b.$f]=$(col "$f" <<<"$L" | median)
    done
    local nerr nfail checks="ok"
    nerr=$(grep -c 'status=error' <<<"$L" || true)
    nfail=$(grep -c 'status=fail' <<<"$L" || true)
    if [ "$nerr" != 0 ] || [ "$nfail" != 0 ]; then
      checks="FAIL: $nerr error(s), $nfail check failure(s) (see $RESULTS)"
    fi
    MED[$row.$b.checks]=$checks
    printf "   %-14s %10s %9s %9s %11s %9s %9s  %s\n" "$b" \
      "$(fmt "${MED[$row.$b.cons_rate]}" %.0f)" "$(fmt "${MED[$row.$b.lat_p50_us]}" %.0f)" \
      "$(fmt "${MED[$row.$b.lat_p99_us]}" %.0f)" "$(fmt "${MED[$row.$b.srv_cpu_us_per_msg]}" %.1f)" \
      "$(fmt "$(awk -v k="${MED[$row.$b.srv_rss_kib]}" 'BEGIN{ if (k=="") print ""; else print k/1024 }')" %.0f)" \
      "$(fmt "${MED[$row.$b.client_cpu_pct]}" %.0f)" "$checks"
  done
  printf "   %-14s %10s %9s %9s %11s %9s\n" "quay/rabbitmq" \
    "$(ratio "${MED[$row.quay.cons_rate]:-}" "${MED[$row.rabbitmq.cons_rate]:-}")" \
    "$(ratio "${MED[$row.quay.lat_p50_us]:-}" "${MED[$row.rabbitmq.lat_p50_us]:-}")" \
    "$(ratio "${MED[$row.quay.lat_p99_us]:-}" "${MED[$row.rabbitmq.lat_p99_us]:-}")" \
    "$(ratio "${MED[$row.quay.srv_cpu_us_per_msg]:-}" "${MED[$row.rabbitmq.srv_cpu_us_per_msg]:-}")" \
    "$(ratio "${MED[$row.quay.srv_rss_kib]:-}" "${MED[$row.rabbitmq.srv_rss_kib]:-}")"
  case "$row" in
    persistent|latency-persistent)
      fsync_floor
      for b in rabbitmq quay; do
        [ -n "${MED[$row.$b.conf_p50_us]:-}" ] || continue
        printf "   %-14s %10s %9s %9s   %s\n" "$b" "" "$(fmt "${MED[$row.$b.conf_p50_us]}" %.0f)" "$(fmt "${MED[$row.$b.conf_p99_us]}" %.0f)" \
          "publish -> confirm latency (conf_p50_us, conf_p99_us)"
      done
      printf "   %-14s %10s %9s %9s   %s\n" "disk floor" "" "$(fmt "${FSYNC_P50:-}" %.0f)" "$(fmt "${FSYNC_P99:-}" %.0f)" \
        "fdatasync after a 4 KiB append (fsync_latency, $FSYNC_ROUNDS rounds, on the brokers' data disk)" ;;
  esac
}

# this disk's fdatasync latency, measured once, in the temp dir that holds both brokers' data
FSYNC_P50="" FSYNC_P99="" FSYNC_DONE=0
fsync_floor() {
  [ "$FSYNC_DONE" = 1 ] && return 0
  FSYNC_DONE=1
  local line
  line=$("$FL" "$TMP" "$FSYNC_ROUNDS" 4096 2>>"$TMP/fsync.err" | grep '^RESULT ' || true)
  echo "row=fsync broker=disk rep=1 rc=0 ${line:-RESULT status=error}" >>"$RESULTS"
  FSYNC_P50=$(field "$line" fsync_p50_us); FSYNC_P99=$(field "$line" fsync_p99_us)
  log "disk: fdatasync 4 KiB append p50 ${FSYNC_P50:-?}us p99 ${FSYNC_P99:-?}us ($line)"
}

# ------------------------------------------------------------------------------ scale rows
idle_measure() { # right after (re)start: RSS after IDLE_SETTLE seconds
  sleep "$IDLE_SETTLE"
  if broker_up rabbitmq; then RMQ_IDLE_KIB=$(awk '/^VmRSS/{print $2}' "/proc/$RMQ_PID/status"); fi
  if broker_up quay; then QUAY_IDLE_KIB=$(awk '/^VmRSS/{print $2}' "/proc/$QUAY_PID/status"); fi
}

print_idle() {
  echo
  echo "== idle: $(row_desc idle)"
  printf "   %-14s %10s %14s\n" broker "RSS MiB" "port open s"
  printf "   %-14s %10s %14s\n" rabbitmq "$(fmt "$(awk -v k="${RMQ_IDLE_KIB:-}" 'BEGIN{if(k!="")print k/1024}')" %.1f)" "$(fmt "${RMQ_STARTUP_S:-}" %.2f)"
  if [ -n "${QUAY_IDLE_KIB:-}" ]; then
    printf "   %-14s %10s %14s\n" quay "$(fmt "$(awk -v k="$QUAY_IDLE_KIB" 'BEGIN{print k/1024}')" %.1f)" "$(fmt "${QUAY_STARTUP_S:-}" %.2f)"
  else
    printf "   %-14s %10s   (%s)\n" quay n/a "${QUAY_WHY:-not running}"
  fi
  printf "   %-14s %10s %14s\n" "quay/rabbitmq" "$(ratio "${QUAY_IDLE_KIB:-}" "${RMQ_IDLE_KIB:-}")" "$(ratio "${QUAY_STARTUP_S:-}" "${RMQ_STARTUP_S:-}")"
  MED[idle.rabbitmq.rss_kib]=${RMQ_IDLE_KIB:-}; MED[idle.quay.rss_kib]=${QUAY_IDLE_KIB:-}
}

run_scale_row() { # queues | conns
  local row=$1 b rep out rc line
  log "row $row: $(row_desc "$row")"
  declare -A lines=()
  for rep in $(seq "$SCALE_REPS"); do
    restart_brokers   # a fresh process each time: earlier rows must not lend it freed memory
    for b in rabbitmq quay; do
      broker_up "$b" || continue
      out=$TMP/out.$row.$b.$rep
      rc=0
      if [ "$row" = queues ]; then
        "$QS" queues -p "$(broker_port "$b")" --watch-pid "$(broker_pid "$b")" -n "$SCALE_QUEUES" --prefix "qs" >"$out" 2>"$out.err" || rc=$?
      else
        "$QS" conns -p "$(broker_port "$b")" --watch-pid "$(broker_pid "$b")" -n "$SCALE_CONNS" >"$out" 2>"$out.err" || rc=$?
      fi
      line=$(grep '^RESULT ' "$out" | tail -1 || true)
      [ -n "$line" ] || line="RESULT status=error error=no_output"
      echo "row=$row broker=$b rep=$rep rc=$rc $line" >>"$RESULTS"
      log "  $b rep $rep: $line $( [ "$rc" = 0 ] || head -c 300 "$out.err")"
      lines[$b]+="$line"$'\n'
    done
  done
  local fields
  if [ "$row" = queues ]; then fields="declares_per_s rss_per_queue_kib rss_after_kib deletes_per_s"; else fields="opens_per_s rss_per_conn_kib rss_after_kib"; fi
  for b in rabbitmq quay; do
    local L=${lines[$b]:-} f
    [ -n "$L" ] || continue
    for f in $fields; do
      MED[$row.$b.$f]=$(col "$f" <<<"$L" | median)
    done
    MED[$row.$b.checks]=$(grep -q 'status=ok' <<<"$L" && ! grep -qv 'status=ok' <<<"$(grep . <<<"$L")" && echo ok || echo "FAIL (see $RESULTS)")
  done
  echo
  echo "== $row: $(row_desc "$row")  (fresh brokers, median of $SCALE_REPS)"
  if [ "$row" = queues ]; then
    printf "   %-14s %12s %14s %13s %12s  %s\n" broker "declares/s" "KiB per queue" "RSS MiB" "deletes/s" checks
    for b in rabbitmq quay; do
      if [ -z "${lines[$b]:-}" ]; then printf "   %-14s %12s\n" "$b" n/a; continue; fi
      printf "   %-14s %12s %14s %13s %12s  %s\n" "$b" "$(fmt "${MED[$row.$b.declares_per_s]}" %.0f)" \
        "$(fmt "${MED[$row.$b.rss_per_queue_kib]}" %.1f)" "$(fmt "$(awk -v k="${MED[$row.$b.rss_after_kib]}" 'BEGIN{if(k!="")print k/1024}')" %.0f)" \
        "$(fmt "${MED[$row.$b.deletes_per_s]}" %.0f)" "${MED[$row.$b.checks]}"
    done
    printf "   %-14s %12s %14s %13s %12s\n" "quay/rabbitmq" \
      "$(ratio "${MED[$row.quay.declares_per_s]:-}" "${MED[$row.rabbitmq.declares_per_s]:-}")" \
      "$(ratio "${MED[$row.quay.rss_per_queue_kib]:-}" "${MED[$row.rabbitmq.rss_per_queue_kib]:-}")" \
      "$(ratio "${MED[$row.quay.rss_after_kib]:-}" "${MED[$row.rabbitmq.rss_after_kib]:-}")" \
      "$(ratio "${MED[$row.quay.deletes_per_s]:-}" "${MED[$row.rabbitmq.deletes_per_s]:-}")"
  else
    printf "   %-14s %12s %14s %13s  %s\n" broker "opens/s" "KiB per conn" "RSS MiB" checks
    for b in rabbitmq quay; do
      if [ -z "${lines[$b]:-}" ]; then printf "   %-14s %12s\n" "$b" n/a; continue; fi
      printf "   %-14s %12s %14s %13s  %s\n" "$b" "$(fmt "${MED[$row.$b.opens_per_s]}" %.0f)" \
        "$(fmt "${MED[$row.$b.rss_per_conn_kib]}" %.1f)" "$(fmt "$(awk -v k="${MED[$row.$b.rss_after_kib]}" 'BEGIN{if(k!="")print k/1024}')" %.0f)" \
        "${MED[$row.$b.checks]}"
    done
    printf "   %-14s %12s %14s %13s\n" "quay/rabbitmq" \
      "$(ratio "${MED[$row.quay.opens_per_s]:-}" "${MED[$row.rabbitmq.opens_per_s]:-}")" \
      "$(ratio "${MED[$row.quay.rss_per_conn_kib]:-}" "${MED[$row.rabbitmq.rss_per_conn_kib]:-}")" \
      "$(ratio "${MED[$row.quay.rss_after_kib]:-}" "${MED[$row.rabbitmq.rss_after_kib]:-}")"
  fi
}

# ------------------------------------------------------------------------------ restart rows
# recovery and memory-flood start each broker alone (the other one stopped), with their own
# data or configuration, and leave both stopped.
declare -A REC=()   # REC[broker.key]
declare -A MF=()    # MF[broker.key]

stop_all() { quay_stop; rmq_stop; }

wait_gone() { # $1 pid, $2 max seconds -> 0 once gone

  for _ in $(seq $(($2 * 20))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.05; done
  return 1
}

secs_between() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "" || b == "") exit; printf "%.2f", b - a }'; }

recovery_one() { # $1 = rabbitmq|quay: fill a durable queue, then restart after SIGTERM and after kill -9
  local b=$1 per total out line rc pid t0 variant probe probe_out launch ready
  per=$(( (RECOVERY_MESSAGES + RECOVERY_PUBLISHERS - 1) / RECOVERY_PUBLISHERS ))
  total=$(( per * RECOVERY_PUBLISHERS ))
  REC[total]=$total
  stop_all
  if [ "$b" = rabbitmq ]; then RMQ_KEEP_DATA=0; rmq_start; else QUAY_KEEP_DATA=0; quay_start; fi
  if ! broker_up "$b"; then REC[$b.why]="did not start"; return 0; fi
  out=$TMP/out.recovery.$b.fill; rc=0
  log "  $b: filling qb-recovery-0 with $total persistent 1 KiB messages ($RECOVERY_PUBLISHERS publishers, confirms)"
  "$QB" -p "$(broker_port "$b")" --watch-pid "$(broker_pid "$b")" -P "$RECOVERY_PUBLISHERS" -C 0 -n "$per" -s 1024 \
    --confirm -w 1000 --persistent --durable --keep --prefix qb-recovery >"$out" 2>"$out.err" || rc=$?
  line=$(grep '^RESULT ' "$out" | tail -1 || true)
  echo "row=recovery-fill broker=$b rep=1 rc=$rc ${line:-RESULT status=error error=no_output}" >>"$RESULTS"
  REC[$b.fill_rate]=$(field "$line" pub_rate)
  log "  $b: filled at $(field "$line" pub_rate) msg/s, $(field "$line" confirmed) confirmed, broker RSS $(field "$line" srv_rss_kib) KiB"
  if [ "$(field "$line" confirmed)" != "$total" ]; then
    REC[$b.why]="fill failed: $(head -c 200 "$out.err")"; stop_all; return 0
  fi
  for variant in term kill9; do
    pid=$(broker_pid "$b")
    t0=$(date +%s.%N)
    if [ "$variant" = term ]; then
      if [ "$b" = rabbitmq ]; then
        RMQ_STOP_WAIT=600 rmq_stop   # rabbitmqctl stop: the graceful path (what SIGTERM does)
      else
        kill -TERM "$pid"; wait_gone "$pid" 600 || kill -9 "$pid"; wait "$pid" 2>/dev/null || true; QUAY_PID="" QUAY_UP=0
      fi
      REC[$b.stop_s]=$(secs_between "$t0" "$(date +%s.%N)")
    else
      { kill -9 "$pid"; wait_gone "$pid" 30 || true; } 2>/dev/null   # (no "Killed" job notice)
      if [ "$b" = rabbitmq ]; then rmq_stop; else { wait "$pid" || true; } 2>/dev/null; QUAY_PID="" QUAY_UP=0; fi
    fi
    # the probe polls from before the launch; recovery = its success time - the launch time
    probe_out=$TMP/out.recovery.$b.$variant
    "$QS" wait-queue -p "$(broker_port "$b")" -q qb-recovery-0 -n "$total" --timeout "$RECOVERY_TIMEOUT" >"$probe_out" 2>&1 &
    probe=$!
    if [ "$b" = rabbitmq ]; then
      RMQ_KEEP_DATA=1 RMQ_START_TIMEOUT=$RECOVERY_TIMEOUT rmq_start; launch=$RMQ_LAUNCH_T
    else
      QUAY_KEEP_DATA=1 QUAY_START_TIMEOUT=$RECOVERY_TIMEOUT quay_start; launch=$QUAY_LAUNCH_T
    fi
    RMQ_KEEP_DATA=0 QUAY_KEEP_DATA=0
    if ! broker_up "$b"; then kill "$probe" 2>/dev/null || true; fi
    rc=0; wait "$probe" || rc=$?
    line=$(grep '^RESULT ' "$probe_out" | tail -1 || true)
    ready=""
    [ "$(field "$line" status)" = ok ] && ready=$(secs_between "$launch" "$(field "$line" ready_epoch)")
    REC[$b.$variant]=$ready
    REC[$b.$variant.rss]=$(broker_up "$b" && awk '/^VmRSS/{print $2}' "/proc/$(broker_pid "$b")/status" || true)
    echo "row=recovery-$variant broker=$b rep=1 rc=$rc ${line:-RESULT status=error error=no_output} recovery_s=${ready:-n/a}" >>"$RESULTS"
    log "  $b after $variant: ready after ${ready:-n/a}s (${line:-no probe output})"
    if [ -z "$ready" ]; then REC[$b.why]="$variant: not recovered (${line:-no probe output})"; break; fi
  done
  stop_all
}

run_recovery_row() {
  log "row recovery: $(row_desc recovery)"
  if [ "$USE_RMQ" != 1 ]; then REC[rabbitmq.why]="disabled"; elif [ "$RECOVERY_RABBIT" = 1 ]; then recovery_one rabbitmq; else REC[rabbitmq.why]="skipped (RECOVERY_RABBIT=0)"; fi
  if [ "$USE_QUAY" = 1 ]; then recovery_one quay; else REC[quay.why]="disabled"; fi
  echo
  echo "== recovery: $(row_desc recovery)"
  echo "   fill: quaybench -P $RECOVERY_PUBLISHERS -C 0 -n $(( (RECOVERY_MESSAGES + RECOVERY_PUBLISHERS - 1) / RECOVERY_PUBLISHERS )) -s 1024 --confirm -w 1000 --persistent --durable --keep;" \
       "probe: quayscale wait-queue -n ${REC[total]:-$RECOVERY_MESSAGES}"
  printf "   %-14s %12s %14s %14s %10s %12s  %s\n" broker "fill msg/s" "SIGTERM s" "kill -9 s" "stop s" "RSS MiB" notes
  local b
  for b in rabbitmq quay; do
    printf "   %-14s %12s %14s %14s %10s %12s  %s\n" "$b" "$(fmt "${REC[$b.fill_rate]:-}" %.0f)" \
      "$(fmt "${REC[$b.term]:-}" %.2f)" "$(fmt "${REC[$b.kill9]:-}" %.2f)" "$(fmt "${REC[$b.stop_s]:-}" %.2f)" \
      "$(fmt "$(awk -v k="${REC[$b.kill9.rss]:-}" 'BEGIN{if(k!="")print k/1024}')" %.0f)" "${REC[$b.why]:-}"
  done
  printf "   %-14s %12s %14s %14s %10s\n" "quay/rabbitmq" "$(ratio "${REC[quay.fill_rate]:-}" "${REC[rabbitmq.fill_rate]:-}")" \
    "$(ratio "${REC[quay.term]:-}" "${REC[rabbitmq.term]:-}")" "$(ratio "${REC[quay.kill9]:-}" "${REC[rabbitmq.kill9]:-}")" \
    "$(ratio "${REC[quay.stop_s]:-}" "${REC[rabbitmq.stop_s]:-}")"
}

memflood_one() { # $1 = rabbitmq|quay
  local b=$1 out line rc hwm peak
  stop_all
  if [ "$b" = rabbitmq ]; then
    RMQ_EXTRA_CONF="vm_memory_high_watermark.absolute = $MEMFLOOD_MARK_BYTES"; rmq_start; RMQ_EXTRA_CONF=""
  else
    QUAY_EXTRA_ARGS="--memory-high-watermark $MEMFLOOD_MARK"; quay_start; QUAY_EXTRA_ARGS=""
  fi
  if ! broker_up "$b"; then MF[$b.why]="did not start"; return 0; fi
  out=$TMP/out.memory-flood.$b; rc=0
  "$QB" -p "$(broker_port "$b")" --watch-pid "$(broker_pid "$b")" -P "$MEMFLOOD_PUBLISHERS" -C 0 -d "$MEMFLOOD_DURATION" -s 1024 \
    --confirm -w 1000 --confirm-timeout 5 --prefix qb-flood >"$out" 2>"$out.err" || rc=$?
  line=$(grep '^RESULT ' "$out" | tail -1 || true)
  [ -n "$line" ] || line="RESULT status=error error=no_output"
  hwm=""
  if broker_up "$b"; then
    hwm=$(awk '/^VmHWM/{print $2}' "/proc/$(broker_pid "$b")/status")   # fresh process: peak since its start
  else
    MF[$b.why]="broker died during the flood"
  fi
  peak=$(awk -v a="${hwm:-0}" -v b="$(field "$line" srv_rss_kib)" 'BEGIN{ if (b + 0 > a + 0) a = b; if (a > 0) print a }')
  echo "row=memory-flood broker=$b rep=1 rc=$rc $line vmhwm_kib=${hwm:-n/a} mark_bytes=$MEMFLOOD_MARK_BYTES" >>"$RESULTS"
  MF[$b.peak_kib]=$peak
  MF[$b.ratio]=$(awk -v k="$peak" -v m="$MEMFLOOD_MARK_BYTES" 'BEGIN{ if (k != "" && m > 0) printf "%.2f", k * 1024 / m }')
  MF[$b.blocked]=$(field "$line" blocked)
  MF[$b.published]=$(field "$line" published)
  MF[$b.pub_rate]=$(field "$line" pub_rate)
  MF[$b.stall_max_s]=$(field "$line" stall_max_s)
  MF[$b.stuck]=$(field "$line" stuck)
  [ "$(field "$line" status)" = ok ] || MF[$b.why]="${MF[$b.why]:-}$(field "$line" error) $(head -c 200 "$out.err")"
  log "  $b: peak RSS ${peak:-?} KiB = ${MF[$b.ratio]:-?} x mark, connection.blocked x${MF[$b.blocked]:-?}, published ${MF[$b.published]:-?}, longest stall ${MF[$b.stall_max_s]:-?}s rc=$rc"
  stop_all
}

# The confirm row's publisher/consumer pair alone, then beside a publisher
# flooding a queue nobody consumes (issue 18: the pair keeps >= 90% of its
# rate until the alarm). Interleaved per rep: alone, beside, for each broker.
run_neighbour_row() {
  local args; args=$(row_args confirm)
  log "row neighbour: $(row_desc neighbour)"
  local b rep mode out rc line fpid
  declare -A rates=()
  for rep in $(seq "$REPS"); do
    for b in rabbitmq quay; do
      broker_up "$b" || continue
      for mode in alone beside; do
        out=$TMP/out.neighbour.$b.$mode.$rep
        fpid=""
        if [ "$mode" = beside ]; then
          local flood_args="-P 1 -C 0 -s 1024 --prefix qb-flood -d $((DURATION + 2)) --confirm-timeout 5"
          [ "$NEIGHBOUR_FLOOD_RATE" = 0 ] || flood_args+=" --rate $NEIGHBOUR_FLOOD_RATE"
          # shellcheck disable=SC2086
          "$QB" -p "$(broker_port "$b")" $flood_args >"$out.flood" 2>&1 &
          fpid=$!
          sleep 1
        fi
        rc=0
        # shellcheck disable=SC2086
        "$QB" -p "$(broker_port "$b")" --watch-pid "$(broker_pid "$b")" -d "$DURATION" --prefix qb-neighbour $args \
          >"$out" 2>"$out.err" || rc=$?
        [ -z "$fpid" ] || wait "$fpid" || true
        line=$(grep '^RESULT ' "$out" | tail -1 || true)
        [ -n "$line" ] || line="RESULT status=error error=no_output"
        echo "row=neighbour-$mode broker=$b rep=$rep rc=$rc $line" >>"$RESULTS"
        [ -z "$fpid" ] || echo "row=neighbour-flooder broker=$b rep=$rep $(grep '^RESULT ' "$out.flood" | tail -1)" >>"$RESULTS"
        log "  $b rep $rep $mode: $(field "$line" cons_rate) msg/s p99 $(field "$line" lat_p99_us)us rc=$rc"
        rates[$b.$mode]+="$(field "$line" cons_rate)"$'\n'
      done
    done
  done
  echo
  echo "== neighbour: $(row_desc neighbour)"
  echo "   quaybench $args -d $DURATION, beside quaybench -P 1 -C 0 -s 1024 (median of $REPS)"
  printf "   %-14s %12s %12s %10s\n" broker "alone msg/s" "beside msg/s" "kept"
  for b in rabbitmq quay; do
    MED[neighbour.$b.alone]=$(printf %s "${rates[$b.alone]:-}" | median)
    MED[neighbour.$b.beside]=$(printf %s "${rates[$b.beside]:-}" | median)
    MED[neighbour.$b.kept]=$(ratio "${MED[neighbour.$b.beside]:-}" "${MED[neighbour.$b.alone]:-}")
    printf "   %-14s %12s %12s %10s\n" "$b" "$(fmt "${MED[neighbour.$b.alone]:-}" %.0f)" \
      "$(fmt "${MED[neighbour.$b.beside]:-}" %.0f)" "${MED[neighbour.$b.kept]:-n/a}"
  done
}

# A CA and a certificate for localhost (both brokers present it; quaybench
# verifies it against the CA and the host name), and the AMQPS listeners.
tls_setup() {
  PKI=$TMP/pki
  mkdir -p "$PKI"
  ( cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=quay bench CA"
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext
    chmod 644 server.key ) >/dev/null 2>&1 || { log "tls: openssl failed"; return 1; }
  RMQ_TLS_CONF="listeners.ssl.default = 127.0.0.1:$RMQ_TLS_PORT
ssl_options.cacertfile = $PKI/ca.pem
ssl_options.certfile = $PKI/server.pem
ssl_options.keyfile = $PKI/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false"
  QUAY_TLS_ARGS="--tls-listen 127.0.0.1:$QUAY_TLS_PORT --tls-cert $PKI/server.pem --tls-key $PKI/server.key"
}

# The confirm row through each broker's plain and AMQPS listeners, in turn:
# what TLS costs in msg/s and in broker CPU per message (issue 17's target:
# AMQPS >= 70% of quay's plain rate).
run_tls_row() {
  local args; args=$(row_args confirm)
  log "row tls: $(row_desc tls)"
  local b rep mode out rc line port
  declare -A lines=()
  for rep in $(seq "$REPS"); do
    for b in rabbitmq quay; do
      broker_up "$b" || continue
      for mode in plain tls; do
        out=$TMP/out.tls.$b.$mode.$rep
        local target="-H 127.0.0.1 -p $(broker_port "$b")"
        if [ "$mode" = tls ]; then
          port=$RMQ_TLS_PORT; [ "$b" = rabbitmq ] || port=$QUAY_TLS_PORT
          target="-H localhost -p $port --tls-ca $PKI/ca.pem"
        fi
        rc=0
        # shellcheck disable=SC2086
        "$QB" $target --watch-pid "$(broker_pid "$b")" -d "$DURATION" --prefix qb-tls $args \
          >"$out" 2>"$out.err" || rc=$?
        line=$(grep '^RESULT ' "$out" | tail -1 || true)
        [ -n "$line" ] || line="RESULT status=error error=no_output"
        echo "row=tls-$mode broker=$b rep=$rep rc=$rc $line" >>"$RESULTS"
        log "  $b rep $rep $mode: $(field "$line" cons_rate) msg/s cpu $(field "$line" srv_cpu_us_per_msg)us/msg" \
            "(broker $(field "$line" srv_cpu_pct)%, client $(field "$line" client_cpu_pct)%) rc=$rc $( [ "$rc" = 0 ] || head -c 300 "$out.err")"
        lines[$b.$mode]+="$line"$'\n'
      done
    done
  done
  echo
  echo "== tls: $(row_desc tls)"
  echo "   quaybench $args -d $DURATION, plain then --tls-ca (median of $REPS)"
  printf "   %-10s %11s %11s %9s %13s %13s %9s\n" broker "plain msg/s" "tls msg/s" "tls/plain" "plain us/msg" "tls us/msg" "client %"
  local f m
  for b in rabbitmq quay; do
    for m in plain tls; do
      for f in cons_rate srv_cpu_us_per_msg client_cpu_pct; do
        MED[tls.$b.$m.$f]=$(col "$f" <<<"${lines[$b.$m]:-}" | median)
      done
    done
    MED[tls.$b.kept]=$(ratio "${MED[tls.$b.tls.cons_rate]:-}" "${MED[tls.$b.plain.cons_rate]:-}")
    printf "   %-10s %11s %11s %9s %13s %13s %9s\n" "$b" "$(fmt "${MED[tls.$b.plain.cons_rate]:-}" %.0f)" \
      "$(fmt "${MED[tls.$b.tls.cons_rate]:-}" %.0f)" "${MED[tls.$b.kept]:-n/a}" \
      "$(fmt "${MED[tls.$b.plain.srv_cpu_us_per_msg]:-}" %.1f)" "$(fmt "${MED[tls.$b.tls.srv_cpu_us_per_msg]:-}" %.1f)" \
      "$(fmt "${MED[tls.$b.tls.client_cpu_pct]:-}" %.0f)"
  done
}

run_memflood_row() {
  log "row memory-flood: $(row_desc memory-flood)"
  if [ "$USE_RMQ" != 1 ]; then MF[rabbitmq.why]="disabled"; elif [ "$MEMFLOOD_RABBIT" = 1 ]; then memflood_one rabbitmq; else MF[rabbitmq.why]="skipped (MEMFLOOD_RABBIT=0)"; fi
  if [ "$USE_QUAY" = 1 ]; then memflood_one quay; else MF[quay.why]="disabled"; fi
  echo
  echo "== memory-flood: $(row_desc memory-flood)"
  echo "   quaybench -P $MEMFLOOD_PUBLISHERS -C 0 -d $MEMFLOOD_DURATION -s 1024 --confirm -w 1000 --confirm-timeout 5;" \
       "quayd --memory-high-watermark $MEMFLOOD_MARK / vm_memory_high_watermark.absolute = $MEMFLOOD_MARK_BYTES"
  printf "   %-14s %12s %12s %9s %12s %10s %10s  %s\n" broker "peak RSS MiB" "peak / mark" "blocked" "published" "pub msg/s" "stall s" notes
  local b
  for b in rabbitmq quay; do
    printf "   %-14s %12s %12s %9s %12s %10s %10s  %s\n" "$b" \
      "$(fmt "$(awk -v k="${MF[$b.peak_kib]:-}" 'BEGIN{if(k!="")print k/1024}')" %.0f)" "$(fmt "${MF[$b.ratio]:-}" %.2f)" \
      "$( [ -n "${MF[$b.blocked]:-}" ] && { [ "${MF[$b.blocked]}" -gt 0 ] && echo "yes(${MF[$b.blocked]})" || echo no; } || echo n/a)" \
      "$(fmt "${MF[$b.published]:-}" %.0f)" "$(fmt "${MF[$b.pub_rate]:-}" %.0f)" "$(fmt "${MF[$b.stall_max_s]:-}" %.1f)" "${MF[$b.why]:-}"
  done
  printf "   %-14s %12s %12s\n" "quay/rabbitmq" "$(ratio "${MF[quay.peak_kib]:-}" "${MF[rabbitmq.peak_kib]:-}")" \
    "$(ratio "${MF[quay.ratio]:-}" "${MF[rabbitmq.ratio]:-}")"
}

# ------------------------------------------------------------------------------ main
echo "quay bench: rows [$ROWS], $REPS x ${DURATION}s, $(nproc) cores, $(uname -r), RabbitMQ ${RMQ_HOME##*-}, quayd $QUAYD"
echo "raw results: $RESULTS"
if [ "${PRETOUCH_GIB:-0}" -gt 0 ]; then
  log "touching ${PRETOUCH_GIB} GiB once (PRETOUCH_GIB)"
  python3 -c 'import sys; n = int(sys.argv[1]) << 30; b = bytearray(n); b[::4096] = b"\x01" * (n // 4096)' \
    "$PRETOUCH_GIB"
fi
NEED_BROKERS=0
for r in $ROWS; do case "$r" in recovery|memory-flood) ;; *) NEED_BROKERS=1 ;; esac; done
for r in $ROWS; do [ "$r" = tls ] && { tls_setup || exit 1; }; done
if [ "$NEED_BROKERS" = 1 ]; then
  start_brokers
  if [ "$RMQ_UP" = 0 ] && [ "$QUAY_UP" = 0 ]; then log "no broker is running"; exit 1; fi
fi
for r in $ROWS; do [ "$r" = idle ] && { idle_measure; print_idle; }; done
for r in $ROWS; do
  case "$r" in idle|queues|conns|recovery|memory-flood) ;; neighbour) run_neighbour_row ;; tls) run_tls_row ;; *) run_tp_row "$r" ;; esac
done
for r in $ROWS; do
  case "$r" in queues|conns) run_scale_row "$r" ;; esac
done
for r in $ROWS; do
  case "$r" in recovery) run_recovery_row ;; memory-flood) run_memflood_row ;; esac
done

# summary: one line per row
echo
echo "== summary (medians; ratio = quay / RabbitMQ; msg/s and declares/s: higher is better, the rest: lower)"
printf "   %-20s %14s %14s %8s   %s\n" row RabbitMQ quay ratio measure
for r in $ROWS; do
  case "$r" in
    idle)   printf "   %-20s %14s %14s %8s   %s\n" idle "$(fmt "${MED[idle.rabbitmq.rss_kib]:-}" %.0f)" "$(fmt "${MED[idle.quay.rss_kib]:-}" %.0f)" \
              "$(ratio "${MED[idle.quay.rss_kib]:-}" "${MED[idle.rabbitmq.rss_kib]:-}")" "RSS KiB" ;;
    queues) for f in declares_per_s rss_per_queue_kib; do
              printf "   %-20s %14s %14s %8s   %s\n" "queues" "$(fmt "${MED[queues.rabbitmq.$f]:-}" %.1f)" "$(fmt "${MED[queues.quay.$f]:-}" %.1f)" \
                "$(ratio "${MED[queues.quay.$f]:-}" "${MED[queues.rabbitmq.$f]:-}")" "$f"; done ;;
    conns)  printf "   %-20s %14s %14s %8s   %s\n" "conns" "$(fmt "${MED[conns.rabbitmq.rss_per_conn_kib]:-}" %.1f)" "$(fmt "${MED[conns.quay.rss_per_conn_kib]:-}" %.1f)" \
              "$(ratio "${MED[conns.quay.rss_per_conn_kib]:-}" "${MED[conns.rabbitmq.rss_per_conn_kib]:-}")" "rss_per_conn_kib" ;;
    recovery)
            for v in term kill9; do
              printf "   %-20s %14s %14s %8s   %s\n" "recovery-$v" "$(fmt "${REC[rabbitmq.$v]:-}" %.2f)" "$(fmt "${REC[quay.$v]:-}" %.2f)" \
                "$(ratio "${REC[quay.$v]:-}" "${REC[rabbitmq.$v]:-}")" "s until ${REC[total]:-$RECOVERY_MESSAGES} msgs declared (target quay < 5)"; done ;;
    tls)    printf "   %-20s %14s %14s %8s   %s\n" tls "${MED[tls.rabbitmq.kept]:-n/a}" "${MED[tls.quay.kept]:-n/a}" "" \
              "the confirm row's AMQPS rate / its plain rate (goal quay >= 0.70)" ;;
    neighbour)
            printf "   %-20s %14s %14s %8s   %s\n" neighbour "${MED[neighbour.rabbitmq.kept]:-n/a}" "${MED[neighbour.quay.kept]:-n/a}" "" \
              "the pair's rate beside a flooder / alone (goal quay >= 0.90)" ;;
    memory-flood)
            printf "   %-20s %14s %14s %8s   %s\n" "memory-flood" "$(fmt "${MF[rabbitmq.ratio]:-}" %.2f)" "$(fmt "${MF[quay.ratio]:-}" %.2f)" \
              "$(ratio "${MF[quay.ratio]:-}" "${MF[rabbitmq.ratio]:-}")" "peak RSS / $MEMFLOOD_MARK (goal quay <= 1.2); connection.blocked: rabbitmq ${MF[rabbitmq.blocked]:-n/a}, quay ${MF[quay.blocked]:-n/a}" ;;
    latency) fs="lat_p50_us lat_p99_us srv_cpu_us_per_msg" ;;&
    latency-persistent) fs="lat_p50_us lat_p99_us conf_p50_us conf_p99_us srv_cpu_us_per_msg" ;;&
    *)      case "$r" in latency*) ;; *) fs="cons_rate srv_cpu_us_per_msg" ;; esac
            for f in $fs; do
              printf "   %-20s %14s %14s %8s   %s\n" "$r" "$(fmt "${MED[$r.rabbitmq.$f]:-}" %.1f)" "$(fmt "${MED[$r.quay.$f]:-}" %.1f)" \
                "$(ratio "${MED[$r.quay.$f]:-}" "${MED[$r.rabbitmq.$f]:-}")" "$f"; done
            if [ "$r" = latency-persistent ] && [ -n "$FSYNC_P99" ]; then
              printf "   %-20s %14s %14s %8s   %s\n" "$r" "" "$(fmt "$FSYNC_P99" %.1f)" "" "disk floor: fdatasync p99 us (p50 $FSYNC_P50)"
            fi ;;
  esac
done
