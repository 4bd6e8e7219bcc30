// Checkpoints of a sharded model (ShardedDataParallel), as safe to kill as Checkpointer's.
//
// <dir>/checkpoint-<step>/ holds shard-<rank>.bin from every rank (its shards of the
// parameters and of the optimizer's state; rank 0's also the buffers, the frozen parameters and
// the CPU random generator) and metadata.json, which names each tensor's whole shape and type
// and, for each contiguous chunk of it, the file and the byte range that hold it. Every rank
// writes and fsyncs its file in checkpoint-<step>.tmp/; once all have, rank 0 writes the
// metadata and renames the directory into place: a checkpoint directory is whole or absent.
//
// A load reads the ranges its own shards cover, whatever the world that wrote them (3 ranks,
// then 2, then 4), and reads Checkpointer's whole checkpoints too; Checkpointer reads these in
// turn into a whole model. Optimizers: torch's Adam, AdamW and SGD.
#pragma once

#include <optional>
#include <string>

#include "ctrun/worker/checkpoint.h"
#include "ctrun/worker/sharded.h"

namespace ctrun::worker {

class ShardedCheckpointer {
 public:
  // `keep`: how many whole checkpoints (of either format) stay on disk.
  explicit ShardedCheckpointer(std::string directory, int keep = 2);

  // A collective: every rank calls it. Throws std::runtime_error naming the file on an I/O
  // error, on every rank (they agree whether the checkpoint was written).
  void save(ShardedDataParallel& model, const torch::optim::Optimizer& optimizer,
            const TrainingProgress& progress) const;

  // Loads the newest checkpoint that reads back whole (sharded, of any world size, or whole)
  // into the shards and `optimizer` (built over model.shard_parameters()), and restores the
  // random generator. One that cannot be read is reported on stderr and the next older one
  // tried. nullopt when there is none.
  std::optional<TrainingProgress> load_latest(ShardedDataParallel& model,
                                              torch::optim::Optimizer& optimizer) const;

 private:
  std::string directory_;
  int keep_;
};

}  // namespace ctrun::worker
