#!/usr/bin/env bash
# Builds the relay and the harness in release mode, then runs every scenario.
# Extra arguments go to `outbox-bench all`, e.g. `bash bench/run.sh --events 200000`;
# `bash bench/run.sh cdc [flags]` runs the CDC comparison instead (on the wal_level=logical
# PostgreSQL that scripts/tools/pg_cdc.sh starts).
# Results: bench/out/results.md or bench/out/cdc.md (and the relay logs and configs next to it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p outbox-cli -p outbox-bench
if [ "${1:-}" = cdc ]; then
  shift
  bash scripts/tools/pg_cdc.sh
  exec target/release/outbox-bench cdc "$@"
fi
exec target/release/outbox-bench all "$@"
