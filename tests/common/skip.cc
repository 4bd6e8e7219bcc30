#define CATCH_CONFIG_EXTERNAL_INTERFACES  // Catch2 2's listener interface (Catch2 3 has it always)
#include "skip.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "catch.h"

namespace ctrun::testing {
namespace {

bool skipped = false;

// After the run: a skipped test that failed nothing leaves with kSkipExitCode.
struct SkipListener : Catch::EventListenerBase {
  using Catch::EventListenerBase::EventListenerBase;
  void testRunEnded(const Catch::TestRunStats& stats) override {
    if (!skipped || stats.totals.assertions.failed > 0) return;
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(kSkipExitCode);
  }
};

CATCH_REGISTER_LISTENER(SkipListener)

}  // namespace

void mark_skipped(const std::string& why) {
  skipped = true;
  std::cout << "SKIPPED: " << why << std::endl;
}

}  // namespace ctrun::testing
