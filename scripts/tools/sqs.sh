#!/usr/bin/env bash
# The SQS test endpoint: moto's server (an SQS emulator) in a virtualenv outside the repository,
# and a shared instance on 127.0.0.1:4566 for the conformance tests. Idempotent: reuses the
# installed venv when its moto is recent enough, and starts the server only if the port is
# closed. The server runs in the background, survives this script and logs to $MOTO_LOG.
set -euo pipefail

VENV=${MOTO_VENV:-/opt/outbox-tools/moto}
PORT=${MOTO_PORT:-4566}
LOG=${MOTO_LOG:-/var/log/outbox-moto.log}
MIN_VERSION=5.0.0 # the SQS JSON protocol the AWS SDK for Rust speaks

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

moto_version() { "$VENV/bin/python" -c 'import moto; print(moto.__version__)' 2>/dev/null || true; }

version_ok() { # installed minimum
  [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

if ! version_ok "$(moto_version)" "$MIN_VERSION" || [ ! -x "$VENV/bin/moto_server" ]; then
  echo "sqs: installing moto[server] into $VENV"
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3-venv >/dev/null
  fi
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade "moto[server]>=$MIN_VERSION"
fi
installed=$(moto_version)
version_ok "$installed" "$MIN_VERSION" || { echo "sqs: moto $installed < $MIN_VERSION" >&2; exit 1; }

if ! port_open "$PORT"; then
  echo "sqs: starting moto $installed on 127.0.0.1:$PORT (log $LOG)"
  mkdir -p "$(dirname "$LOG")"
  nohup setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >>"$LOG" 2>&1 </dev/null &
  for _ in $(seq 1 60); do port_open "$PORT" && break; sleep 1; done
  port_open "$PORT" || { echo "sqs: moto did not come up on port $PORT (see $LOG)" >&2; exit 1; }
fi
echo "sqs: moto $installed is up on 127.0.0.1:$PORT"
