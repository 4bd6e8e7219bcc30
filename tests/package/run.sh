#!/usr/bin/env bash
# Installs the build in BUILD_DIR into a scratch prefix, then configures, builds and runs a
# consumer project that uses find_package(ctrun).
# Usage: run.sh BUILD_DIR SCRATCH_DIR [CXX_FLAGS [PREFIX_PATH]]  (CXX_FLAGS: e.g. the sanitizer
# flags the installed static libraries were built with, which the consumer must link with too;
# PREFIX_PATH: ':'-separated prefixes where the build found its dependencies)
set -euo pipefail
build_dir="$1"
scratch="$2"
flags="${3:-}"
prefix_path="$scratch/prefix${4:+;${4//:/;}}"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$scratch"
cmake --install "$build_dir" --prefix "$scratch/prefix" > "$scratch.install.log"
test -x "$scratch/prefix/bin/ctrund"
cmake -S "$here/consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix_path" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  > "$scratch.configure.log" || { cat "$scratch.configure.log"; exit 1; }
cmake --build "$scratch/build" > "$scratch.build.log" || { cat "$scratch.build.log"; exit 1; }
"$scratch/build/consumer"
rm -rf "$scratch" "$scratch.install.log" "$scratch.configure.log" "$scratch.build.log"
