#!/usr/bin/env bash
# Checks the Kubernetes manifests offline (no cluster, no registry): schemas, the
# kustomization, their agreement with each other, the image and the relay's config, and a
# black-box run of the Deployment's commands on the debug build. What each step asserts:
# check.py's docstring. CI runs it (.ci/deploy.sh) after the workspace's debug build.
#
#   bash deploy/kubernetes/check.sh           # check (OUTBOX_BIN: default target/debug/outbox)
#   bash deploy/kubernetes/check.sh --write   # regenerate prometheusrule.yaml from
#                                             # deploy/prometheus/outbox-alerts.yml
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

# The validators, pinned in requirements.txt, in a virtualenv of their own cached under
# target/deploy-cache/ and rebuilt when requirements.txt changes.
venv="$root/target/deploy-cache/kubernetes-venv"
stamp="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [[ "$(cat "$venv/.requirements" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  echo "$stamp" > "$venv/.requirements"
fi

if [[ "${1:-}" == "--write" ]]; then
  exec "$venv/bin/python" "$here/check.py" --write
fi

bin="${OUTBOX_BIN:-$root/target/debug/outbox}"
if [[ ! -x "$bin" ]]; then
  echo "FAIL: $bin is not an executable outbox binary (build it, or set OUTBOX_BIN)" >&2
  exit 1
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
start=$(date +%s)
"$venv/bin/python" "$here/check.py" "$bin"
echo "deploy/kubernetes: all checks passed in $(( $(date +%s) - start ))s"
