#!/usr/bin/env bash
# Checks what deploy/ ships, as far as this machine allows: each deploy/*/check.sh validates
# its own assets (container root filesystem, Kubernetes manifests, systemd unit) against the
# debug build of `outbox` that the test step builds.
set -euo pipefail
cd "$(dirname "$0")/.."
for check in deploy/*/check.sh; do
  echo "== $check"
  bash "$check"
done
