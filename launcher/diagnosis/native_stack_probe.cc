#include "launcher/diagnosis/native_stack_probe.h"

#include <boost/process/v2/environment.hpp>
#include <fstream>
#include <optional>
#include <vector>

#include "launcher/diagnosis/native_stacks.h"
#include "launcher/workers/captured_run.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

namespace {

constexpr std::size_t kMaxOutput = 256 * 1024;

std::optional<int> yama_ptrace_scope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (in >> scope) return scope;
  return std::nullopt;
}

// Appends a line of the agent's own to eu-stack's output.
void add_line(std::string& text, const std::string& line) {
  if (!text.empty() && text.back() != '\n') text += '\n';
  text += line + "\n";
}

}  // namespace

asio::awaitable<NativeStacks> capture_native_stacks(asio::any_io_executor executor, int pid,
                                                    std::chrono::milliseconds timeout) {
  if (bp::environment::find_executable("eu-stack").empty()) {
    co_return NativeStacks{"eu-stack (elfutils) not found on PATH: no native stacks", false};
  }
  // (A named vector: g++ 12 cannot take a braced list of strings in a co_await's arguments.)
  const std::vector<std::string> args = {"-p", std::to_string(pid)};
  CapturedRun run = co_await run_captured(executor, "eu-stack", args, timeout, kMaxOutput);
  if (!run.started) co_return NativeStacks{run.text, false};
  std::string text = std::move(run.text);
  if (run.timed_out) {
    add_line(text, "(eu-stack did not finish within " + std::to_string(timeout.count()) +
                       " ms: stopped)");
  }
  if (run.truncated) add_line(text, "(eu-stack's output cut at 256 KiB)");
  if (auto hint = attach_refusal_hint(text, yama_ptrace_scope())) add_line(text, *hint);
  co_return NativeStacks{std::move(text), run.succeeded};
}

}  // namespace ctrun::launcher
