#!/usr/bin/env bash
# The whole test suite from a fresh clone: install dependencies, configure, build, run ctest.
#   scripts/test.sh              normal build in build/
#   scripts/test.sh --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer build in build-sanitize/
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
# Warnings are errors here (CI runs this script); a user's own build only warns.
cmake_args=(-DCTRUN_WERROR=ON)
if [[ "${1:-}" == "--sanitize" ]]; then
  build_dir=build-sanitize
  cmake_args+=(-DCTRUN_SANITIZE=ON -DCTRUN_BUILD_BENCH=OFF)
elif [[ $# -gt 0 ]]; then
  echo "scripts/test.sh: unknown argument '$1' (expected nothing or --sanitize)" >&2
  exit 2
fi

bash scripts/setup.sh
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}"
cmake --build "$build_dir" -j "$(nproc)"
cd "$build_dir"
ctest --output-on-failure -j "$(nproc)" --timeout 600
