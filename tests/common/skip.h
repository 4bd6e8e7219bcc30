// A test that cannot run here (no etcd, no root, no GPU, no Slurm) says why and is reported by
// ctest as skipped, never as passed: CTRUN_SKIP records the reason and returns from the test
// body, so its locals (scratch directories, child processes) are cleaned up as usual; once the
// run ends without a failure the process exits with kSkipExitCode, which tests/CMakeLists.txt
// gives ctest as each test's SKIP_RETURN_CODE (ctest runs every test case in a process of its
// own).
#pragma once

#include <string>

namespace ctrun::testing {

inline constexpr int kSkipExitCode = CTRUN_TEST_SKIP_CODE;  // 77, or 4 with Catch2 3

void mark_skipped(const std::string& why);

}  // namespace ctrun::testing

#define CTRUN_SKIP(why)                  \
  do {                                   \
    ::ctrun::testing::mark_skipped(why); \
    return;                              \
  } while (0)
