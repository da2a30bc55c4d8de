#!/usr/bin/env bash
# The dependency audit: `cargo deny check` (advisories, licenses, sources, bans; deny.toml).
# The RustSec database lives on GitHub, which CI machines do not reach: its advisories for the
# crates in Cargo.lock are vendored in deny/advisory-db/ (deny/refresh-advisories.sh) and
# opened from a git repository made here, as cargo-deny reads a database.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.20.2
if ! cargo deny --version 2>/dev/null | grep -q " $version"; then
  cargo install cargo-deny --locked --version "$version"
fi
snapshot=$(cat deny/advisory-db/SNAPSHOT)
age_days=$(( ( $(date +%s) - $(date -d "${snapshot#* }" +%s) ) / 86400 ))
echo "advisory snapshot: $snapshot ($age_days days old)"
if [ "$age_days" -gt 90 ]; then
  echo "warning: the vendored advisories are over 90 days old; run deny/refresh-advisories.sh" >&2
fi
# A crate added to Cargo.lock since the snapshot has had no advisory looked up for it.
missing=$(comm -23 <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.lock | sort -u) deny/advisory-db/CRATES)
if [ -n "$missing" ]; then
  echo "crates in Cargo.lock that deny/advisory-db was not refreshed for (run" \
    "deny/refresh-advisories.sh): $missing" >&2
  exit 1
fi
# cargo-deny's directory for the default database URL (name-xxhash64 of the URL, lowercased).
dbs=target/advisory-dbs
db=$dbs/advisory-db-3157b0e258782691
rm -rf "$dbs"
mkdir -p "$db"
cp -r deny/advisory-db/crates "$db/"
git -C "$db" init -q
git -C "$db" add crates
git -C "$db" -c user.name=ci -c user.email=ci@localhost commit -q -m "RustSec $snapshot"
# `--offline` keeps cargo-deny from fetching the database; the crate graph comes from
# `cargo metadata`, run here with the network (it downloads the manifests it lacks).
cargo metadata --locked --format-version 1 > target/deny-metadata.json
cargo deny --offline --metadata-path target/deny-metadata.json check
