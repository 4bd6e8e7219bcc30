// Takes a running worker's native stacks with elfutils' eu-stack, before the agent kills it as
// hung (--worker_timeout): where each thread of a C++ worker (or a Python one's interpreter) is
// stuck. Bounded in time and output.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <string>

namespace ctrun::launcher {

struct NativeStacks {
  std::string text;    // eu-stack's output (stdout and stderr together), or why there is none
  bool taken = false;  // eu-stack ran and exited 0
};

// Never fails: a missing eu-stack, a refused ptrace attach (with the likely reason), a timeout
// are told in `text`.
boost::asio::awaitable<NativeStacks> capture_native_stacks(boost::asio::any_io_executor executor,
                                                           int pid,
                                                           std::chrono::milliseconds timeout);

}  // namespace ctrun::launcher
