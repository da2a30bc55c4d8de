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
# cargo unpacks the packages it serves to the later ones under
# $CARGO_HOME/registry/src/-<hash>/ and never unpacks the same name and version again: the
# sources of an earlier run (an earlier commit) would be built instead of this one's. Only those
# local registries are named with a leading dash; crates.io's are kept.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rm -rf "$cargo_home"/registry/src/-*/ "$cargo_home"/registry/cache/-*/
# Nor does it rebuild a registry crate of a name and version it has built: drop what earlier
# runs built from those sources (their dep-info names the local registry's path).
target=${CARGO_TARGET_DIR:-target}
for depinfo in "$target"/debug/deps/*.d; do
  if grep -qF "/registry/src/-" "$depinfo" 2>/dev/null; then
    stem=$(basename "$depinfo" .d)
    rm -rf "$target"/debug/deps/"$stem".* "$target"/debug/deps/lib"$stem".* \
      "$target"/debug/.fingerprint/*-"${stem##*-}"
  fi
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
