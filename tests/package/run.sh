#!/usr/bin/env bash
# Installs the build in BUILD_DIR into a scratch prefix, then configures, builds and runs a
# consumer project that uses find_package(ctrun). Usage: run.sh BUILD_DIR SCRATCH_DIR
set -euo pipefail
build_dir="$1"
scratch="$2"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$scratch"
cmake --install "$build_dir" --prefix "$scratch/prefix" > "$scratch.install.log"
test -x "$scratch/prefix/bin/ctrund"
cmake -S "$here/consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$scratch/build" > /dev/null
"$scratch/build/consumer"
rm -rf "$scratch" "$scratch.install.log"
