#!/usr/bin/env bash
# The test suite: starts the services it needs if they are down, then runs every test of the
# workspace (unit, integration against PostgreSQL, NATS JetStream and RabbitMQ, process-level).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh
cargo test --workspace --locked "$@"
