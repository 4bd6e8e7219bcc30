#include "launcher/workers/captured_run.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect_pipe.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/writable_pipe.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <memory>

#include "launcher/workers/child_process.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using namespace asio::experimental::awaitable_operators;

namespace {

asio::awaitable<void> read_until_end(asio::readable_pipe& pipe, std::string& text,
                                     std::size_t max_output) {
  std::array<char, 4096> buf;
  while (text.size() < max_output) {
    auto [ec, n] =
        co_await pipe.async_read_some(asio::buffer(buf), asio::as_tuple(asio::use_awaitable));
    text.append(buf.data(), std::min(n, max_output - text.size()));
    if (ec) co_return;
  }
}

}  // namespace

asio::awaitable<CapturedRun> run_captured(asio::any_io_executor executor,
                                          const std::string& program,
                                          const std::vector<std::string>& args,
                                          std::chrono::milliseconds timeout,
                                          std::size_t max_output) {
  CapturedRun run;
  asio::readable_pipe output(executor);
  asio::writable_pipe child_output(executor);
  boost::system::error_code ec;
  asio::connect_pipe(output, child_output, ec);
  if (ec) {
    run.text = "cannot run " + program + ": " + ec.message();
    co_return run;
  }
  auto started = start_child(
      executor, program, args,
      bp::process_stdio{nullptr, child_output.native_handle(), child_output.native_handle()}, {});
  if (!started) {
    run.text = "cannot run " + program + ": " + started.error().message;
    co_return run;
  }
  run.started = true;
  std::unique_ptr<bp::process> child = std::move(started).value();
  child_output.close(ec);  // the child holds its copy: the output ends when the child does

  asio::steady_timer deadline(executor, timeout);
  const auto read = co_await (read_until_end(output, run.text, max_output) ||
                              deadline.async_wait(asio::as_tuple(asio::use_awaitable)));
  output.close(ec);  // past the cap, a write of the child's fails instead of blocking
  run.timed_out = read.index() == 1;
  run.truncated = run.text.size() >= max_output;
  int status = -1;
  if (!run.timed_out) {
    const auto exited = co_await (child->async_wait(asio::as_tuple(asio::use_awaitable)) ||
                                  deadline.async_wait(asio::as_tuple(asio::use_awaitable)));
    run.timed_out = exited.index() == 1;
    if (!run.timed_out) status = child->native_exit_code();
  }
  if (run.timed_out) child->terminate(ec);  // SIGKILL, and reaped
  run.succeeded = !run.timed_out && status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  co_return run;
}

}  // namespace ctrun::launcher
