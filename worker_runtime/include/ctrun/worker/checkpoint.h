// Checkpoints that survive being killed at any moment. Rank 0 writes
// <dir>/checkpoint-<step>.pt through a temporary file that is fsynced and then renamed (and the
// directory fsynced), so a checkpoint file is either whole or absent; older checkpoints are
// removed only after the new one is whole. On start every rank loads the newest whole one, so
// a restarted job resumes where the last save left it. A sharded model's checkpoints
// (sharded_checkpoint.h) sit beside these, and each kind loads the other.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/worker/torch_forward.h"

namespace ctrun::worker {

// Where training stands, beside the model and optimizer state.
struct TrainingProgress {
  std::int64_t epoch = 0;                // the epoch in progress (or next, after its last step)
  std::int64_t step = 0;                 // optimizer steps taken over the whole run
  std::uint64_t epoch_consumed = 0;      // samples of this epoch read by all ranks together
  int world_size = 1;                    // the world that wrote it (a resume may have another)
  std::map<std::string, double> values;  // the trainer's own numbers (e.g. a running loss)
};

class Checkpointer {
 public:
  // `keep`: how many whole checkpoints stay on disk (at least 1; older ones are removed).
  Checkpointer(std::string directory, int rank, int keep = 2);

  // Rank 0 writes (creating the directory); other ranks return at once. Also stores the CPU
  // random generator's state. Throws std::runtime_error naming the file on an I/O error.
  void save(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
            const TrainingProgress& progress) const;

  // Loads the newest checkpoint that reads back whole into `module` and `optimizer` and
  // restores the random generator. A file that cannot be read is reported on stderr and the
  // next older one tried. nullopt when there is none.
  std::optional<TrainingProgress> load_latest(torch::nn::Module& module,
                                              torch::optim::Optimizer& optimizer) const;

  // Whole checkpoints (files, and sharded ones' directories), newest first.
  std::vector<std::string> list() const;

 private:
  std::string directory_;
  int rank_;
  int keep_;
};

}  // namespace ctrun::worker
