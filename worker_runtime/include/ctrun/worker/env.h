// The environment contract a worker is started with (docs/env.md), read and checked. Works
// under ctrun, under torchrun, and with no launcher at all (a single process, world size 1).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/store_address.h"

namespace ctrun::worker {

using rendezvous::Error;
using rendezvous::Result;

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: none given (a single process needs none)
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string error_file;                         // empty: none given
  std::optional<rendezvous::StoreAddress> store;  // when ctrun gives CTRUN_STORE_*
  // TORCHELASTIC_USE_AGENT_STORE: torchrun's agent already serves a TCPStore at
  // MASTER_ADDR:MASTER_PORT; otherwise rank 0's worker starts one there.
  bool use_agent_store = false;
  bool launched = false;  // started by a launcher (RANK and WORLD_SIZE were set)
  // ctrun --fault_tolerance=step (CTRUN_FAULT_TOLERANCE=step): the replica slot this worker
  // asks the per-step quorum as (CTRUN_REPLICA_ID), which its replacement keeps.
  bool fault_tolerant = false;
  std::string replica_id;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

// Errors name the variable and what was expected, e.g.
// "WORLD_SIZE: expected a positive integer, got 'four'".
Result<WorkerEnv> read_worker_env(const EnvLookup& env);

}  // namespace ctrun::worker
