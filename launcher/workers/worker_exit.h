// How one worker process ended: what WorkerGroup reports and the agent's decisions read.
#pragma once

#include <chrono>

namespace ctrun::launcher {

struct WorkerExit {
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it
  std::chrono::system_clock::time_point at{};
  bool ok() const { return exit_code == 0 && signal == 0; }
};

}  // namespace ctrun::launcher
