// The state one replica hands to another that heals from it, as one buffer: the model, the
// optimizer, the last committed step, the sampler's place and the CPU random generator. One
// flattened transfer instead of one per tensor.
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/worker/fault_tolerance.h"

namespace ctrun::worker {

std::string save_replica_state(const ReplicaState& state, std::int64_t committed_step);
// Loads what save_replica_state() wrote into `state`; returns its committed step. Throws
// std::runtime_error when the bytes are not a replica state of this model.
std::int64_t load_replica_state(const ReplicaState& state, const std::string& bytes);

}  // namespace ctrun::worker
