// The units of a ShardedDataParallel, built once when the wrapper is made: which trained
// parameters are sharded together, and each unit's memory (the whole parameters as one flat
// buffer the module's parameters alias, this rank's shard, the gradient buffers). The Engine
// (sharded.cc) runs each step's gathers, reductions and optimizer step over them.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ctrun/worker/process_group.h"
#include "worker_runtime/base/shard_layout.h"

namespace ctrun::worker::sharding {

// `numel` elements of `base`'s memory from `offset` on, as a tensor of its own: autograd does
// not see it as a view of `base`, so writing through it (a collective, the optimizer) bumps no
// version counter that a saved tensor of the model's graph checks. `base`'s memory must be
// allocated when this is called.
at::Tensor alias(const at::Tensor& base, int64_t offset, int64_t numel);

// Stage 3 frees a unit's gathered parameters by taking the memory from under its storage, not
// by dropping the tensor: the graph's saved tensors (e.g. a weight's transpose) keep pointing
// at that storage, and find the values again once the unit is gathered into it for backward.
// This is what FSDP does with storage resize_(0).
void release_memory(const at::Tensor& t);
void restore_memory(const at::Tensor& t);

enum class Gathered { kNo, kInFlight, kYes };

struct Unit {
  std::vector<std::size_t> members;  // indices into the engine's parameters
  ShardLayout layout;
  bool root = false;  // stage 3: the parameters in no listed module
  at::Tensor full;    // [padded], compute type: the whole parameters; stage 3: memory only
                      // while gathered
  std::vector<at::Tensor> views;  // each member's shape over `full`
  at::Tensor shard;       // [shard], what the optimizer steps, in the parameters' own type; without
                          // mixed precision at stages 1-2 an alias into `full`
  at::Tensor grad_full;   // stage 1: [padded]; the members' .grad are aliases into it
  at::Tensor grad_shard;  // [shard], compute type: this rank's chunk of the reduced gradients
                          // (stage 1: an alias into grad_full)

  // This backward pass.
  std::size_t pending = 0;  // members whose gradient is not ready
  bool complete = false;    // every member's gradient is ready (and, stages 2-3, in grad_input)
  at::Tensor grad_input;    // stages 2-3: the unit's gradient, flat, to be reduce-scattered
  at::Tensor grad_output;   // stages 2-3: this rank's chunk of the sum
  std::unique_ptr<Work> reduce;
  std::unique_ptr<Work> replicate;  // HSDP: the shard's average across the replicas

  // Stage 3.
  Gathered gathered = Gathered::kYes;
  std::unique_ptr<Work> gather;
};

// The module's parameters that require a gradient, in registration order, with their names.
// Throws std::invalid_argument when there is none, or one is not of a floating type, or not of
// the first one's type and device.
struct TrainedParameters {
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
};
TrainedParameters trained_parameters(torch::nn::Module& module);

// Stage 3: one unit per listed module that holds trained parameters, in the order listed,
// then the root: the rest. Checked whole before any parameter moves (a bad list leaves the
// model as it was): std::invalid_argument for a null module, a parameter that is not the
// model's, or one in two units.
struct Stage3Plan {
  std::vector<std::pair<const torch::nn::Module*, std::vector<std::size_t>>> listed;
  std::vector<std::size_t> rest;  // the root's members; empty: no root
};
Stage3Plan plan_stage3_units(const TrainedParameters& trained,
                             const std::vector<std::shared_ptr<torch::nn::Module>>& units);

struct UnitSettings {
  int stage = 1;
  at::ScalarType compute_type = at::kFloat;  // of the parameters and the collectives
  bool mixed = false;                        // compute_type is not the parameters' own
  int rank = 0;                              // in the group that shards
  int size = 1;
};
// A unit of `members` (indices into `params`): moves their values into its flat buffer and
// points the parameters (and, at stage 1, their gradients) at it.
Unit make_unit(std::vector<at::Tensor>& params, const std::vector<std::size_t>& members, bool root,
               const UnitSettings& settings);

}  // namespace ctrun::worker::sharding
