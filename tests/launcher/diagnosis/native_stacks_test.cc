#include "launcher/diagnosis/native_stacks.h"

#include <string>

#include "catch.h"

using namespace ctrun::launcher;

namespace {

// eu-stack's layout: a process line, then each thread and its frames, innermost first.
std::string eu_stack_output(int threads, int frames) {
  std::string out = "PID 100 - process\n";
  for (int t = 0; t < threads; ++t) {
    out += "TID " + std::to_string(100 + t) + ":\n";
    for (int f = 0; f < frames; ++f) {
      out += '#';  // appended: g++ 12 -O3 warns falsely on "literal" + std::string&&
      out += std::to_string(f) + "  0x00007f00000000" + std::to_string(f) + " fn_" +
             std::to_string(t) + "_" + std::to_string(f) + "\n";
    }
  }
  return out;
}

}  // namespace

TEST_CASE("native stacks: each thread's innermost frames, what is left out counted") {
  const std::string summary = summarize_native_stacks(eu_stack_output(10, 12), 3, 2);
  CHECK(summary.find("PID 100 - process\nTID 100:\n#0 ") == 0);
  CHECK(summary.find("fn_0_2\n... 9 more frames\nTID 101:\n") != std::string::npos);
  CHECK(summary.find("fn_0_3") == std::string::npos);
  CHECK(summary.find("fn_1_2\n... 9 more frames\n... 8 more threads\n") != std::string::npos);
  CHECK(summary.find("TID 102") == std::string::npos);
  // Small enough: unchanged.
  const std::string small = eu_stack_output(2, 3);
  CHECK(summarize_native_stacks(small, 3, 2) == small);
  CHECK(summarize_native_stacks(eu_stack_output(1, 2), 1, 1).find("... 1 more frame\n") !=
        std::string::npos);
}

TEST_CASE("native stacks: eu-stack's own errors are kept, a refused attach explained") {
  const std::string refused = "eu-stack: dwfl_linux_proc_attach pid 42: Operation not permitted\n";
  CHECK(summarize_native_stacks(refused) == refused);
  auto hint = attach_refusal_hint(refused, 1);
  REQUIRE(hint.has_value());
  CHECK(hint->find("ptrace_scope=1") != std::string::npos);
  CHECK(hint->find("CAP_SYS_PTRACE") != std::string::npos);
  hint = attach_refusal_hint(refused, std::nullopt);  // no Yama in this kernel
  REQUIRE(hint.has_value());
  CHECK(hint->find("ptrace_scope") == hint->find("ptrace_scope=0"));  // only the remedy
  CHECK(attach_refusal_hint(refused, 3)->find("until the next boot") != std::string::npos);
  CHECK_FALSE(attach_refusal_hint(eu_stack_output(1, 1), 1).has_value());
}
