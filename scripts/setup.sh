#!/usr/bin/env bash
# Installs every Debian 12 package quay needs to build, test and fuzz.
# Run as root (or through sudo). Idempotent: fast when all is present.
#   scripts/setup.sh          build + test dependencies
#   scripts/setup.sh --bench  also RabbitMQ, the side-by-side reference for bench/
set -euo pipefail

packages=(
  # build
  build-essential cmake pkg-config
  libuv1-dev libraft-dev libssl-dev
  # tests: unit harness, fuzzers, real clients
  libcmocka-dev clang libclang-rt-dev
  python3 python3-pika python3-amqp python3-kombu python3-amqplib python3-pytest
  librabbitmq-dev amqp-tools
  librabbitmq-client-java libslf4j-java default-jdk-headless
  # cluster fault tests: network namespaces and nftables
  iproute2 nftables procps
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(rabbitmq-server)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  # policy-rc.d keeps packaged services (rabbitmq-server) from being
  # started by the installer: bench/ starts RabbitMQ by hand.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq \
    --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present"
