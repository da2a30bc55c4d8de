#!/usr/bin/env bash
# Kafka for the tests: tansu, a Kafka-protocol broker, installed from crates.io into
# /opt/outbox-tools/tansu (reused when the right version is there), and a shared in-memory
# broker on 127.0.0.1:9092 started in the background if that port is closed. Idempotent.
# Also makes sure the Debian packages rdkafka's bundled librdkafka builds against are there.
#
#   bash scripts/tools/kafka.sh            install if needed, start if needed
#   TANSU_PORT=19092 bash scripts/tools/kafka.sh
set -euo pipefail

TANSU_VERSION=0.6.0
ROOT=/opt/outbox-tools/tansu
TANSU="$ROOT/bin/tansu"
PORT="${TANSU_PORT:-9092}"
LOG="${TANSU_LOG:-/var/log/outbox-tansu.log}"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Build dependencies of rdkafka-sys (librdkafka's configure script: make, a C/C++ compiler;
# zlib and OpenSSL headers for the `libz` and `ssl` features).
missing=()
for pkg in make gcc g++ pkg-config zlib1g-dev libssl-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "kafka: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

installed_version() {
  [ -x "$TANSU" ] || return 0
  # `.crates.toml` records what `cargo install` put in this root: `"tansu 0.6.0 (registry…)"`.
  sed -n 's/^"tansu \([0-9][^ ]*\) .*/\1/p' "$ROOT/.crates.toml" 2>/dev/null | head -n1
}

if [ "$(installed_version)" != "$TANSU_VERSION" ]; then
  echo "kafka: installing tansu $TANSU_VERSION into $ROOT (from crates.io; ~15 minutes)"
  cargo install tansu --version "=$TANSU_VERSION" --locked --features dynostore \
    --root "$ROOT" --force
fi
[ "$(installed_version)" = "$TANSU_VERSION" ] || {
  echo "kafka: tansu $TANSU_VERSION is not installed in $ROOT" >&2
  exit 1
}

if ! port_open "$PORT"; then
  echo "kafka: starting tansu on 127.0.0.1:$PORT (in memory; log $LOG)"
  mkdir -p "$(dirname "$LOG")"
  # setsid: the broker outlives this script and its caller's process group.
  setsid "$TANSU" broker \
    --listener-url "tcp://127.0.0.1:$PORT" \
    --advertised-listener-url "tcp://127.0.0.1:$PORT" \
    --storage-engine memory://tansu/ \
    </dev/null >>"$LOG" 2>&1 &
  for _ in $(seq 1 60); do
    port_open "$PORT" && break
    sleep 1
  done
  port_open "$PORT" || {
    echo "kafka: tansu did not come up on port $PORT (see $LOG)" >&2
    exit 1
  }
fi
echo "kafka: tansu $TANSU_VERSION is up on 127.0.0.1:$PORT"
