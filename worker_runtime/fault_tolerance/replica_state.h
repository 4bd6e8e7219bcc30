// The state one replica hands to another that heals from it, as one buffer: the model, the
// optimizer, the last committed step, the sampler's place and the CPU random generator. One
// flattened transfer instead of one per tensor: its length, then its bytes, over the quorum's
// communicator.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "ctrun/worker/fault_tolerance.h"

namespace ctrun::worker {

std::string save_replica_state(const ReplicaState& state, std::int64_t committed_step);
// Loads what save_replica_state() wrote into `state`; returns its committed step. Throws
// std::runtime_error when the bytes are not a replica state of this model.
std::int64_t load_replica_state(const ReplicaState& state, const std::string& bytes);

// The buffer sent to rank `to` of `group` / received from rank `from`, through tensors on
// `device` (the group's: CPU for Gloo, the worker's GPU for NCCL). Throw what the group throws;
// receiving also throws std::runtime_error for a length that cannot be a state.
void send_replica_bytes(ProcessGroup& group, const std::string& bytes, int to, at::Device device);
std::string recv_replica_bytes(ProcessGroup& group, int from, at::Device device);

}  // namespace ctrun::worker
