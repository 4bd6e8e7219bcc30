// Collectives over many tensors at once, shared by the data-parallel wrappers.
#pragma once

#include <vector>

#include "ctrun/worker/process_group.h"

namespace ctrun::worker {

// Broadcasts `tensors` from rank 0 in one collective per dtype and device: thousands of small
// tensors would otherwise cost thousands of round trips.
void broadcast_coalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors);

}  // namespace ctrun::worker
