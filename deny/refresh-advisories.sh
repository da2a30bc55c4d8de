#!/usr/bin/env bash
# Refreshes deny/advisory-db/ from a clone of the RustSec advisory database: copies the
# advisories of every crate named in Cargo.lock, and records the clone's commit and date.
# CI machines reach crates.io but not GitHub, so `cargo deny check advisories` reads this
# vendored subset (see .ci/deny.sh). Run it after adding a dependency, and at least monthly:
#   git clone https://github.com/rustsec/advisory-db /tmp/advisory-db
#   bash deny/refresh-advisories.sh /tmp/advisory-db
set -euo pipefail
src=${1:?usage: refresh-advisories.sh PATH-TO-ADVISORY-DB-CLONE}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/deny/advisory-db
rm -rf "$out/crates"
mkdir -p "$out/crates"
sed -n 's/^name = "\(.*\)"$/\1/p' "$root/Cargo.lock" | sort -u | while read -r crate; do
    if [ -d "$src/crates/$crate" ]; then
        cp -r "$src/crates/$crate" "$out/crates/"
    fi
done
# The crates this snapshot was taken for: .ci/deny.sh fails when Cargo.lock names another.
sed -n 's/^name = "\(.*\)"$/\1/p' "$root/Cargo.lock" | sort -u > "$out/CRATES"
git -C "$src" log -1 --format='%H %cI' > "$out/SNAPSHOT"
echo "vendored $(find "$out/crates" -name '*.md' | wc -l) advisories from $(cat "$out/SNAPSHOT")"
