// The store traffic of a process group's bootstrap from N simulated ranks: one TCP connection
// each, driven from one thread by an epoll loop, each rank a small state machine that speaks
// torch's TCPStore wire with the requests of init_process_group and its store-based barrier.
// bootstrap_bench times it against torch's server and ctrun's; the worker-store test runs it
// as an agent's worker against that agent's store.
#pragma once

#include <chrono>
#include <string>

#include "rendezvous/protocol/tcpstore_wire.h"

namespace bootstrap_load {

struct LoadOptions {
  std::string host = "127.0.0.1";  // IPv4
  int port = 0;
  int ranks = 0;
  // 1: every rank from one address (the kernel's choice); more: rank i binds its socket to one
  // of this many addresses of 127.0.0.0/8 (from 127.1.0.1 on), as ranks on many hosts would.
  int source_addresses = 1;
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
  long requests = 0;  // requests sent (VALIDATE counted), for requests per second
};

LoadResult run_bootstrap(const LoadOptions& options);

}  // namespace bootstrap_load
