#!/usr/bin/env bash
# Builds the relay and the harness in release mode, then runs every scenario.
# Extra arguments go to `outbox-bench all`, e.g. `bash bench/run.sh --events 200000`.
# Results: bench/out/results.md (and the relay logs and configs next to it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p outbox-cli -p outbox-bench
exec target/release/outbox-bench all "$@"
