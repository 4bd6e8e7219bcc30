// A process group of `size` ranks meeting in `store`, for a worker whose environment is `env`
// (which says where this host's Gloo device binds, and which GPU NCCL uses). What
// init_process_group does once per run, and the fault-tolerant group once per quorum.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"

namespace ctrun::worker {

std::unique_ptr<ProcessGroup> make_group(const WorkerEnv& env,
                                         const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, const ProcessGroupOptions& options);

}  // namespace ctrun::worker
