#include "native_stack_probe.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect_pipe.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/writable_pipe.hpp>
#include <boost/process/v2/environment.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <fstream>
#include <optional>

#include "child_process.h"
#include "native_stacks.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using namespace asio::experimental::awaitable_operators;

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

asio::awaitable<void> read_until_end(asio::readable_pipe& pipe, std::string& text) {
  std::array<char, 4096> buf;
  while (text.size() < kMaxOutput) {
    auto [ec, n] =
        co_await pipe.async_read_some(asio::buffer(buf), asio::as_tuple(asio::use_awaitable));
    text.append(buf.data(), std::min(n, kMaxOutput - text.size()));
    if (ec) co_return;
  }
}

}  // namespace

asio::awaitable<NativeStacks> capture_native_stacks(asio::any_io_executor executor, int pid,
                                                    std::chrono::milliseconds timeout) {
  if (bp::environment::find_executable("eu-stack").empty()) {
    co_return NativeStacks{"eu-stack (elfutils) not found on PATH: no native stacks", false};
  }
  asio::readable_pipe output(executor);
  asio::writable_pipe child_output(executor);
  boost::system::error_code ec;
  asio::connect_pipe(output, child_output, ec);
  if (ec) co_return NativeStacks{"cannot run eu-stack: " + ec.message(), false};
  auto started = start_child(
      executor, "eu-stack", {"-p", std::to_string(pid)},
      bp::process_stdio{nullptr, child_output.native_handle(), child_output.native_handle()}, {});
  if (!started) co_return NativeStacks{"cannot run eu-stack: " + started.error().message, false};
  std::unique_ptr<bp::process> probe = std::move(started).value();
  child_output.close(ec);  // the child holds its copy: the output ends when eu-stack does

  std::string text;
  asio::steady_timer deadline(executor, timeout);
  const auto read = co_await (read_until_end(output, text) ||
                              deadline.async_wait(asio::as_tuple(asio::use_awaitable)));
  output.close(ec);  // past the cap, a write of eu-stack's fails instead of blocking
  bool timed_out = read.index() == 1;
  int status = -1;
  if (!timed_out) {
    const auto exited = co_await (probe->async_wait(asio::as_tuple(asio::use_awaitable)) ||
                                  deadline.async_wait(asio::as_tuple(asio::use_awaitable)));
    timed_out = exited.index() == 1;
    if (!timed_out) status = probe->native_exit_code();
  }
  if (timed_out) {
    probe->terminate(ec);  // SIGKILL, and reaped
    add_line(text, "(eu-stack did not finish within " + std::to_string(timeout.count()) +
                       " ms: stopped)");
  }
  if (text.size() >= kMaxOutput) add_line(text, "(eu-stack's output cut at 256 KiB)");
  if (auto hint = attach_refusal_hint(text, yama_ptrace_scope())) add_line(text, *hint);
  const bool taken = !timed_out && status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  co_return NativeStacks{std::move(text), taken};
}

}  // namespace ctrun::launcher
