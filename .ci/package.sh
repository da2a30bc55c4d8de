#!/usr/bin/env bash
# Packages every publishable crate as crates.io would receive it, in dependency order, and
# builds each from its package alone (`cargo package` verifies by compiling the unpacked
# sources; the crates not yet on a registry are served from the packages made before them).
# Fails on a missing file, a path outside the crate, a dependency without a version, or
# metadata crates.io refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
crates=(outbox outbox-relayer outbox-consumer outbox-example-orders outbox-cli)
args=()
for crate in "${crates[@]}"; do
  args+=(-p "$crate")
done
# `cargo package` refuses a tree with uncommitted changes; pass --allow-dirty by hand when
# trying it before a commit.
cargo package --locked "${args[@]}" "$@"
for crate in "${crates[@]}"; do
  file=$(ls target/package/"$crate"-[0-9]*.crate)
  # Every package carries its README and the license text it declares.
  listing=$(tar -tzf "$file")
  for member in README.md LICENSE; do
    if ! grep -qx "[^/]*/$member" <<<"$listing"; then
      echo "$file lacks $member" >&2
      exit 1
    fi
  done
done
# The unpublishable crates stay unpublishable.
for manifest in crates/outbox-testkit crates/outbox-sim bench examples/quickstart examples/service; do
  grep -qx 'publish = false' "$manifest/Cargo.toml" || {
    echo "$manifest/Cargo.toml must say publish = false" >&2
    exit 1
  }
done
echo "packaged: ${crates[*]}"
