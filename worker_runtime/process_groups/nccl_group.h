// The NCCL backend, driven through NCCL's own C API (not c10d::ProcessGroupNCCL), so it builds
// against any LibTorch, CPU-only ones included, wherever CUDA and NCCL are installed; a CUDA
// LibTorch is needed only to have CUDA tensors to reduce at run time.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ctrun/worker/process_group.h"

namespace ctrun::worker {

// Uses CUDA device `device` (LOCAL_RANK). Throws CollectiveError when this build has no NCCL,
// no such device exists, or the communicator cannot be formed within `timeout`.
std::unique_ptr<ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, int device,
                                              std::chrono::milliseconds timeout);

}  // namespace ctrun::worker
