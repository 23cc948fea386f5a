#!/usr/bin/env bash
# Installs every Debian 12 package quay needs to build, test and fuzz.
# Run as root (or through sudo). Idempotent: fast when all is present.
#   scripts/setup.sh          build + test dependencies
#   scripts/setup.sh --bench  the same (RabbitMQ, bench/'s reference, is always installed)
set -euo pipefail

packages=(
  # build
  build-essential cmake pkg-config
  libuv1-dev libraft-dev libssl-dev
  # tests: unit harness, fuzzers, real clients
  libcmocka-dev clang libclang-rt-dev
  python3 python3-pika python3-amqp python3-kombu python3-pytest
  librabbitmq-dev amqp-tools
  librabbitmq-client-java libslf4j-java default-jdk-headless
  # cluster fault tests: network namespaces and nftables
  iproute2 nftables procps
  # gdb: 20-cluster-failover kills a broker at a chosen function (kill_at)
  gdb
  # promtool, which checks GET /metrics (tests/integration/31-metrics.py); the
  # package's Prometheus server is not wanted (not started: see policy-rc.d)
  prometheus
  # rabbitmqadmin (inside its management plugin) and RabbitMQ 3.10 itself,
  # which tests/integration/36-rabbitmqadmin.py runs against quay and by hand
  # for the definitions round trip (never as a service: see policy-rc.d)
  rabbitmq-server
  # the web console's test (tests/integration/40-console.py) loads the page
  # in headless Chromium
  chromium
)
# Node.js for the amqplib interop test (tests/integration/08-amqplib.py).  By
# command, not by package: a node that came with its own npm is fine as it is.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  # A policy-rc.d that says no (101) keeps packaged services (rabbitmq-server,
  # prometheus) from being started by the installer, with or without
  # systemd: bench/ starts RabbitMQ by hand, and only promtool is used.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    made_policy=1
  fi
  status=0
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" || status=$?
  if ((made_policy)); then
    $SUDO rm -f "$policy"
  fi
  if ((status)); then
    exit "$status"
  fi
fi
echo "setup: all packages present"

# The locked amqplib for tests/integration/node.  `npm ci` reinstalls from
# scratch every time, so skip it while node_modules was installed from the
# current package-lock.json.
node_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/integration/node"
stamp="$node_dir/node_modules/.quay-installed-lock.json"
if ! cmp -s "$node_dir/package-lock.json" "$stamp"; then
  echo "setup: npm ci in tests/integration/node"
  npm ci --prefix "$node_dir" --no-audit --no-fund
  cp "$node_dir/package-lock.json" "$stamp"
fi
echo "setup: node modules present"
