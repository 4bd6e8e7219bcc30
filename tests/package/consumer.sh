#!/usr/bin/env bash
# Builds the consumer project (find_package(ctrun)) against the ctrun installed under PREFIX,
# and runs it against that prefix's own ctrund, started here and stopped by its PID.
# Usage: consumer.sh PREFIX SCRATCH_DIR [CXX_FLAGS [PREFIX_PATH]]  (CXX_FLAGS: the flags the
# installed static libraries were built with, e.g. the sanitizers', which the consumer must
# link with too; PREFIX_PATH: ':'-separated prefixes where the build found its dependencies)
set -euo pipefail
prefix="$1"
scratch="$2"
flags="${3:-}"
prefix_path="$prefix${4:+;${4//:/;}}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$scratch"
cmake -S "$here/consumer" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix_path" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  > "$scratch/configure.log" || { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/build" > "$scratch/build.log" || { cat "$scratch/build.log"; exit 1; }
"$prefix/bin/ctrund" --host 127.0.0.1 --port 0 --port_file "$scratch/port" \
  > "$scratch/ctrund.log" 2>&1 &
ctrund_pid=$!
trap 'kill "$ctrund_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$scratch/port" ] && break; sleep 0.1; done
[ -s "$scratch/port" ] || { echo "ctrund did not start:"; cat "$scratch/ctrund.log"; exit 1; }
"$scratch/build/consumer" "$(cat "$scratch/port")"
kill "$ctrund_pid"
wait "$ctrund_pid" || true
