// A load generator that plays N rendezvous nodes from one single-threaded process: N TCP
// connections to ctrund from many addresses of 127.0.0.0/8 (as agents on many hosts), each says
// hello (proving the token, as a packaged daemon asks), then all join one job with min = max = N
// at once, with the agents' default timeouts.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace rdzv_bench {

struct StormOptions {
  int port = 0;
  int nodes = 16;
  std::string job = "rdzv_bench";
  std::optional<std::string> token;           // the daemon's, proven in each hello
  int nodes_per_address = 512;                // under ctrund's default per-host limit of 1024
  std::chrono::seconds connect_deadline{60};  // all connected and greeted by then
  std::chrono::seconds join_deadline{120};    // all joins answered by then
};

struct StormResult {
  bool ok = false;
  std::string error;               // why not ok
  double join_wall_s = 0;          // first join sent .. last join answer received
  double first_answer_s = 0;       // first join sent .. first answer received
  std::uint64_t answer_bytes = 0;  // received after the joins went out: the answers, framed
};

// Runs the storm against 127.0.0.1:port. Bounded by the two deadlines.
StormResult run_join_storm(const StormOptions& options);

}  // namespace rdzv_bench
