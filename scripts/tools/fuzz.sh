#!/usr/bin/env bash
# Runs one cargo-fuzz target of fuzz/ for a while; installs cargo-fuzz from crates.io first if
# it is missing (idempotent).
#
#   scripts/tools/fuzz.sh list                        the targets
#   scripts/tools/fuzz.sh TARGET [SECONDS] [ARGS...]  run TARGET (default 60 s); ARGS go to
#                                                     libFuzzer (e.g. -jobs=2, -runs=1000)
#
# The corpus grows in fuzz/corpus/TARGET (not committed); fuzz/seeds/TARGET, when present, is
# read as well. A crash stops the run and leaves its input in fuzz/artifacts/TARGET/: replay it
# with `cargo fuzz run --sanitizer none TARGET fuzz/artifacts/TARGET/crash-…` from fuzz/.
#
# Stable Rust: the build uses `--sanitizer none` (coverage instrumentation only). The code
# under test is safe Rust (`unsafe_code = "forbid"`); AddressSanitizer would need a nightly
# toolchain (`-Zsanitizer`). With one, FUZZ_SANITIZER=address turns it on.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
target=${1:?usage: scripts/tools/fuzz.sh list | TARGET [SECONDS] [libFuzzer args...]}
seconds=${2:-60}
shift $(( $# < 2 ? $# : 2 ))

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz (crates.io)"
  # Its own build directory, whatever CARGO_TARGET_DIR says.
  env -u CARGO_TARGET_DIR cargo install cargo-fuzz --locked
fi

cd "$ROOT/fuzz"
if [ "$target" = list ]; then
  exec cargo fuzz list
fi
mkdir -p "corpus/$target"
dirs=("corpus/$target")
[ -d "seeds/$target" ] && dirs+=("seeds/$target")
# -timeout: an input that takes over 10 s counts as a hang (a crash); -print_final_stats: the
# execution count and rate at the end.
exec cargo fuzz run --sanitizer "${FUZZ_SANITIZER:-none}" "$target" "${dirs[@]}" -- \
  -max_total_time="$seconds" -timeout=10 -print_final_stats=1 "$@"
