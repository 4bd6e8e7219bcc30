#!/usr/bin/env bash
# Installs the build in BUILD_DIR into a scratch prefix, compiles each installed rendezvous header
# alone, then builds and runs the consumer project that uses find_package(ctrun) against it
# (consumer.sh).
# Usage: run.sh BUILD_DIR SCRATCH_DIR [CXX_FLAGS [PREFIX_PATH]]
set -euo pipefail
build_dir="$1"
scratch="$2"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$scratch"
mkdir -p "$scratch"
cmake --install "$build_dir" --prefix "$scratch/prefix" > "$scratch/install.log"
test -x "$scratch/prefix/bin/ctrund"
# Each installed rendezvous header stands alone on the installed tree (none names a private one).
for header in "$scratch"/prefix/include/ctrun/rendezvous/*.h; do
  echo "#include \"$header\"" | "${CXX:-c++}" -std=c++20 -fsyntax-only -x c++ \
    -I"$scratch/prefix/include" - ||
    { echo "installed header does not compile alone: $header"; exit 1; }
done
bash "$here/consumer.sh" "$scratch/prefix" "$scratch/consumer" "${3:-}" "${4:-}"
rm -rf "$scratch"
