// Runs a short-lived helper of the agent's (eu-stack on a hung worker, the workers' Python asked
// which torch it has) and reads what it prints, stdout and stderr together, bounded in time and
// size: past the deadline it is killed and reaped.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace ctrun::launcher {

struct CapturedRun {
  std::string text;        // its output (at most max_output bytes), or why it did not run
  bool started = false;    // it ran (else `text` says why not)
  bool timed_out = false;  // stopped at the deadline
  bool truncated = false;  // its output went past max_output
  bool succeeded = false;  // exited 0 within the deadline
};

boost::asio::awaitable<CapturedRun> run_captured(boost::asio::any_io_executor executor,
                                                 const std::string& program,
                                                 const std::vector<std::string>& args,
                                                 std::chrono::milliseconds timeout,
                                                 std::size_t max_output);

}  // namespace ctrun::launcher
