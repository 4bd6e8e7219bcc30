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
# Each installed rendezvous header stands alone on the installed tree (none names a private one).
for header in "$scratch"/prefix/include/ctrun/rendezvous/*.h; do
  echo "#include \"$header\"" | "${CXX:-c++}" -std=c++20 -fsyntax-only -x c++ \
    -I"$scratch/prefix/include" - || { echo "installed header does not compile alone: $header"; exit 1; }
done
cmake -S "$here/consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix_path" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  > "$scratch.configure.log" || { cat "$scratch.configure.log"; exit 1; }
cmake --build "$scratch/build" > "$scratch.build.log" || { cat "$scratch.build.log"; exit 1; }
# The consumer talks to the installed ctrund, started here and stopped by its PID.
"$scratch/prefix/bin/ctrund" --host 127.0.0.1 --port 0 --port_file "$scratch/port" \
  > "$scratch.ctrund.log" 2>&1 &
ctrund_pid=$!
trap 'kill "$ctrund_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$scratch/port" ] && break; sleep 0.1; done
[ -s "$scratch/port" ] || { echo "ctrund did not start:"; cat "$scratch.ctrund.log"; exit 1; }
"$scratch/build/consumer" "$(cat "$scratch/port")"
kill "$ctrund_pid"
wait "$ctrund_pid" || true
rm -rf "$scratch" "$scratch.install.log" "$scratch.configure.log" "$scratch.build.log" \
  "$scratch.ctrund.log"
