// What each worker process is given: its command line and torchrun's environment contract
// (docs/env.md). Pure functions: the agent supplies every input.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ctrun/launcher/log_line_prefix.h"  // a worker's console prefix
#include "ctrun/launcher/options.h"
#include "ctrun/rendezvous/store_address.h"

namespace ctrun::launcher {

// One node's place in the current round, as the rendezvous assigned it.
struct RoundPlacement {
  int group_rank = 0;
  int group_world_size = 1;
  int rank_offset = 0;  // global rank of local rank 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: restarts of the job so far
};

// The torch a Python worker imports, as major and minor release: what torch's own agent of that
// release gives its workers differs (NCCL_ASYNC_ERROR_HANDLING up to 2.1,
// TORCH_NCCL_ASYNC_ERROR_HANDLING from 2.2, TORCHELASTIC_SIGNALS_TO_HANDLE in 2.x).
struct TorchVersion {
  int major = 0;
  int minor = 0;
  auto operator<=>(const TorchVersion&) const = default;
};
// "2.11.0+cu130", "1.13.0a0": the release; nullopt for anything else.
std::optional<TorchVersion> parse_torch_version(const std::string& text);
// What the agent runs to learn it, without importing torch (which takes seconds): `python -c`
// this prints torch/version.py's __version__ of the torch the worker would import, or nothing.
extern const char* const kTorchVersionProbe;

struct WorkerEnvInputs {
  const LaunchOptions* options = nullptr;
  // The workers' torch, when the agent found it (Python entrypoints: the torch of $PYTHON_EXEC or
  // python3); nullopt: not known (an executable, no torch), and both generations' names are
  // given.
  std::optional<TorchVersion> torch;
  std::string run_id;
  int local_world_size = 1;
  int local_rank = 0;
  RoundPlacement placement;
  rendezvous::StoreAddress store;  // passed on as CTRUN_STORE_*
  bool use_agent_store = false;
  std::string error_file;
  // CTRUN_HEARTBEAT_FILE with --worker_timeout or --faults; else empty.
  std::string heartbeat_file;
  // CTRUN_RESULT_FILE with --fault_report: where the worker may write its result (a digest of
  // its parameters), which the report quotes; else empty.
  std::string result_file;
  // CTRUN_FAULT_FILE with --faults: where the agent writes a planned exception or CUDA error
  // (the kind, "exception" or "cuda_error", on the first line; the message on the second),
  // which the worker raises or makes at its next reported step (ctrun_worker.report_step,
  // report_step in C++).
  std::string fault_file;
  // With heartbeat files: the directory holding ctrun's Python helper (ctrun_worker.py), put
  // first on PYTHONPATH so that a script imports it; else empty.
  std::string python_helper_dir;
  // PYTHONFAULTHANDLER=1 unless the agent's environment sets it: a Python worker judged hung
  // dumps every thread's stack on the agent's SIGABRT (--worker_timeout).
  bool python_fault_handler = false;
  // With ctrun's helper directory: CTRUN_STACKS_FILE and CTRUN_STACKS_SIGNAL, on which the
  // helper's sitecustomize.py registers faulthandler so that the agent can take the running
  // worker's Python stacks (hang reports); else empty.
  std::string stacks_file;
  int stacks_signal = 0;
  // --flight_recorder: the prefix of the worker's NCCL Flight Recorder dump (<prefix><rank>) and
  // of its pipe (<prefix><rank>.pipe); the recorder's variables that the agent's environment
  // does not set are set. Empty: none.
  std::string flight_recorder_prefix;
  bool set_omp_num_threads = false;  // OMP_NUM_THREADS unset and more than one local worker
  // TORCHELASTIC_TIMER_FILE: the pipe of the agent's file timer server
  // (TORCHELASTIC_ENABLE_FILE_TIMER=1); empty: the agent's own value, if any, passes through.
  std::string timer_file;
  // --fault_tolerance=step: the worker's replica slot (CTRUN_REPLICA_ID), which its replacement
  // keeps.
  std::string replica_id;
  // --fault_tolerance=step: this ctrun executable, which a Python worker's FaultTolerance runs
  // as `ctrun worker-proxy` to reach the quorum and the job's store (CTRUN_WORKER_PROXY).
  std::string worker_proxy;
};

// The agent's own environment ("K=V" entries) with the worker's variables set over it. With
// --virtual_local_rank, LOCAL_RANK is 0 and CUDA_VISIBLE_DEVICES is the worker's own entry of
// the agent's CUDA_VISIBLE_DEVICES (in `base`), or its local rank when the agent has none.
std::vector<std::string> worker_environment(const std::vector<std::string>& base,
                                            const WorkerEnvInputs& in);

// With --virtual_local_rank and a CUDA_VISIBLE_DEVICES in the agent's environment, every local
// rank needs an entry of it (torchrun raises the same error when it starts the workers).
rendezvous::Status check_virtual_local_rank(const LaunchOptions& options, int local_world_size,
                                            const EnvLookup& env);

struct WorkerCommand {
  std::string executable;  // a path, or a name to look up on PATH
  std::vector<std::string> args;
};
// A .py entrypoint, -m or --run_path: `$PYTHON_EXEC -u ...` (python3 by default); anything else,
// or --no_python, is executed directly.
WorkerCommand worker_command(const LaunchOptions& options, const std::string& python_exec);

}  // namespace ctrun::launcher
