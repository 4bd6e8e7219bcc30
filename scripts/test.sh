#!/usr/bin/env bash
# The whole test suite from a fresh clone: install dependencies, configure, build, run ctest.
#   scripts/test.sh              normal build in build/
#   scripts/test.sh --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer build in build-sanitize/
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
# Warnings are errors here (CI runs this script); a user's own build only warns.
# The benchmarks are not built here (no test runs them; scripts/bench/run.sh builds its own):
# about 190 s of CPU that CI's 30 minutes cannot spare.
cmake_args=(-DCTRUN_WERROR=ON -DCTRUN_BUILD_TESTS=ON -DCTRUN_BUILD_BENCH=OFF)
# -g1 (line tables and function names: enough for backtraces and the watchdog's stacks) builds
# about a third faster than -g on these template-heavy sources; CI's 30 minutes need it.
cmake_args+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
if [[ "${1:-}" == "--sanitize" ]]; then
  build_dir=build-sanitize
  cmake_args+=(-DCTRUN_SANITIZE=ON)
elif [[ $# -gt 0 ]]; then
  echo "scripts/test.sh: unknown argument '$1' (expected nothing or --sanitize)" >&2
  exit 2
fi

bash scripts/setup.sh --tests
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}"
cmake --build "$build_dir" -j "$(nproc)"
cd "$build_dir"
status=0
# One test more than cores: a quarter of the suite's time its tests wait on processes and
# timers (measured at -j2 on 2 cores: 1,311 s of CPU in 866 s).
ctest --output-on-failure -j "$(($(nproc) + 1))" --timeout 600 --output-junit ctest-results.xml ||
  status=$?
# A Catch test whose name ctest cannot hand back (a ';' splits it) would run nothing and pass.
if grep -q "No test cases matched" Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "scripts/test.sh: ctest entries that matched no Catch test (a ';' in a TEST_CASE name?):" >&2
  grep "No test cases matched" Testing/Temporary/LastTest.log >&2
  status=1
fi
# One line saying how many ran, failed and were skipped (a test that cannot run here, e.g. with
# no GPU, is skipped and listed above by ctest, never counted as passed).
if [[ -f ctest-results.xml ]]; then
  count() { grep -m1 -o "$1=\"[0-9]*\"" ctest-results.xml | grep -o '[0-9]*'; }
  total=$(count tests) failed=$(count failures) skipped=$(count skipped)
  echo "scripts/test.sh: $((total - skipped)) tests ran, $((total - skipped - failed)) passed," \
    "$failed failed, $skipped skipped"
fi
exit "$status"
