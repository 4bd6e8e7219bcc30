// What the whole (rank 0's .pt file) and the sharded (a directory, a file per rank) checkpoint
// formats share: their names in the checkpoint directory, the progress record, a file written
// whole or not at all, and the pruning of old ones.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ctrun/worker/checkpoint.h"

namespace ctrun::worker {

struct CheckpointEntry {
  std::int64_t step = 0;
  std::string path;
  bool sharded = false;  // a directory <dir>/checkpoint-<step> (sharded_checkpoint.h)
};

// Whole checkpoints of either format in `directory`, newest first (temporaries are not).
std::vector<CheckpointEntry> list_checkpoints(const std::string& directory);
std::string whole_checkpoint_path(const std::string& directory, std::int64_t step);
std::string sharded_checkpoint_path(const std::string& directory, std::int64_t step);

nlohmann::json progress_to_json(const TrainingProgress& progress);
TrainingProgress progress_from_json(const nlohmann::json& j);

// Writes `path` through a temporary that `write` fills (it returns false after an error of
// its own, which it names in `error`), fsyncs it, renames it into place. Throws
// std::runtime_error naming the file.
void write_file_durably(const std::string& path,
                        const std::function<bool(int fd, std::string& error)>& write);

// Removes all but the newest `keep` checkpoints and what killed writers left behind.
void prune_checkpoints(const std::string& directory, int keep);

// Removes `path` and all below it, without std::filesystem::remove_all (which pip LibTorch 2.x's
// own copy of it broke: docs/worker_runtime.md, Known limits). Best effort.
void remove_tree(const std::string& path);
bool path_exists(const std::string& path);

}  // namespace ctrun::worker
