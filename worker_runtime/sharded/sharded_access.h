// What the sharded checkpoints and fault tolerance see of a ShardedDataParallel: its units'
// layouts and shards.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ctrun/worker/sharded.h"
#include "worker_runtime/base/shard_layout.h"

namespace ctrun::worker {

struct ShardedUnitView {
  std::vector<std::string> names;            // of the member parameters, in the layout's order
  std::vector<std::vector<int64_t>> shapes;  // and their whole shapes
  ShardLayout layout;
  at::Tensor shard;  // this rank's (stages 1-2: an alias into the whole parameters)
};

class ShardedAccess {
 public:
  static std::vector<ShardedUnitView> units(const ShardedDataParallel& model);
  static ProcessGroup& group(const ShardedDataParallel& model);
  // Stage 3: frees every gathered unit (whose values a load is about to make stale).
  static void release_all(ShardedDataParallel& model);
  // Stages 1-2: all-gathers the shards into the whole parameters (after a load of the shards).
  static void gather_shards(ShardedDataParallel& model);
  // Fault tolerance: the step will not be stepped, or the shards were replaced: its gradients
  // go and the parameters are gathered from the shards when next used. No collective.
  static void discard_step(ShardedDataParallel& model);
};

}  // namespace ctrun::worker
