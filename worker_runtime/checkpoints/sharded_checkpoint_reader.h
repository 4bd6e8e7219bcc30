// Reads one sharded checkpoint directory (sharded_checkpoint.h): its metadata, and any range of
// any tensor in it, from whichever rank's file holds each part of that range.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ctrun/worker/checkpoint.h"

namespace torch::nn {
class Module;
}

namespace ctrun::worker {

class ShardedCheckpointReader {
 public:
  // Throws std::runtime_error naming the file when the metadata is missing or malformed.
  explicit ShardedCheckpointReader(std::string directory);
  ~ShardedCheckpointReader();
  ShardedCheckpointReader(const ShardedCheckpointReader&) = delete;
  ShardedCheckpointReader& operator=(const ShardedCheckpointReader&) = delete;

  TrainingProgress progress() const;
  std::int64_t optimizer_step() const;
  std::vector<std::string> optimizer_fields() const;
  bool has(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;

  // Elements [offset, offset + out.numel()) of tensor `name`, flattened, into `out` (a
  // contiguous CPU tensor of the tensor's type). Throws std::runtime_error naming the tensor
  // and the file when a chunk is missing or a file is short.
  void read(const std::string& name, int64_t offset, at::Tensor out) const;
  // The whole tensor, on the CPU.
  at::Tensor read_whole(const std::string& name) const;

 private:
  int file(const std::string& name) const;
  const nlohmann::json& entry(const std::string& name) const;

  std::string directory_;
  nlohmann::json metadata_;
  mutable std::map<std::string, int> files_;
};

// Checkpointer's side: a sharded checkpoint into a whole model and its optimizer.
TrainingProgress load_sharded_into_whole(const std::string& directory, torch::nn::Module& module,
                                         torch::optim::Optimizer& optimizer);

}  // namespace ctrun::worker
