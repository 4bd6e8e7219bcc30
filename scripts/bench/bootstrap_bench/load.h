// The load generator of bootstrap_bench: N simulated ranks, one TCP connection each, driven from
// one thread by an epoll loop, each rank a small state machine that speaks torch's TCPStore wire
// with the store traffic of init_process_group and its store-based barrier.
#pragma once

#include <chrono>
#include <string>

#include "rendezvous/protocol/tcpstore_wire.h"

namespace bootstrap_bench {

struct LoadOptions {
  int port = 0;
  int ranks = 0;
  // kLegacy: torch <= 2.0's numbering (what torch 1.13's server speaks); kValidated: torch 2.2+'s
  // (every connection opens with VALIDATE).
  ctrun::rendezvous::tcpstore::Dialect dialect = ctrun::rendezvous::tcpstore::Dialect::kLegacy;
  int connect_window = 128;  // connects in flight at once (inside the listen backlog)
  // A diagnostic: count a rank against the window until its first answer (ADD init/) rather than
  // until its connect completes, so the server's accept queue never holds more than the window.
  // Real ranks do not wait for each other like this.
  bool paced = false;
  int value_bytes = 128;  // the "unique id" rank 0 publishes (NCCL's is 128 bytes)
  std::chrono::seconds timeout{120};
};

struct LoadResult {
  bool ok = false;
  std::string error;  // when !ok: the first failure, and how far the ranks had got
  // Seconds from the first connect() to the moment the last rank ...
  double connected_s = 0;  // ... was connected
  double unique_id_s = 0;  // ... held rank 0's value
  double wall_s = 0;       // ... was through the barrier: the benchmark's number
  double generator_cpu_s = 0;
  int connect_retries = 0;
};

LoadResult run_bootstrap(const LoadOptions& options);

}  // namespace bootstrap_bench
