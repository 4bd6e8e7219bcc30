#include "worker_runtime/checkpoints/checkpoint_files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "rendezvous/base/durable_file.h"

namespace ctrun::worker {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kSuffix = ".pt";
constexpr const char* kMetadata = "metadata.json";

std::string errno_text() { return std::strerror(errno); }

// The step in "checkpoint-<step>" followed by `suffix`; nullopt for anything else (temporaries
// included).
std::optional<std::int64_t> step_of(const std::string& name, const std::string& suffix) {
  const std::string prefix = kPrefix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit) ||
      digits.size() > 18) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

}  // namespace

std::string whole_checkpoint_path(const std::string& directory, std::int64_t step) {
  return directory + "/" + kPrefix + std::to_string(step) + kSuffix;
}

std::string sharded_checkpoint_path(const std::string& directory, std::int64_t step) {
  return directory + "/" + kPrefix + std::to_string(step);
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& directory) {
  std::vector<CheckpointEntry> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (auto step = step_of(name, kSuffix)) {
      found.push_back({*step, entry.path().string(), false});
    } else if (auto sharded = step_of(name, "");
               sharded && path_exists(entry.path().string() + "/" + kMetadata)) {
      found.push_back({*sharded, entry.path().string(), true});
    }
  }
  // Newest first; of a step saved both ways, the sharded one (any fixed order: ranks agree).
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.step != b.step ? a.step > b.step : a.sharded > b.sharded;
  });
  return found;
}

nlohmann::json progress_to_json(const TrainingProgress& p) {
  return {{"epoch", p.epoch},
          {"step", p.step},
          {"epoch_consumed", p.epoch_consumed},
          {"world_size", p.world_size},
          {"values", p.values}};
}

TrainingProgress progress_from_json(const nlohmann::json& j) {
  TrainingProgress p;
  p.epoch = j.at("epoch").get<std::int64_t>();
  p.step = j.at("step").get<std::int64_t>();
  p.epoch_consumed = j.at("epoch_consumed").get<std::uint64_t>();
  p.world_size = j.at("world_size").get<int>();
  p.values = j.at("values").get<std::map<std::string, double>>();
  return p;
}

void write_file_durably(const std::string& path,
                        const std::function<bool(int fd, std::string& error)>& write) {
  const std::string temp_path = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("checkpoint: create " + temp_path + ": " + errno_text());
  std::string error;
  if (!write(fd, error) && error.empty()) error = "cannot write '" + temp_path + "'";
  if (error.empty() && ::fsync(fd) != 0) error = "cannot sync '" + temp_path + "': " + errno_text();
  ::close(fd);
  if (!error.empty()) {
    ::unlink(temp_path.c_str());
    throw std::runtime_error("checkpoint: " + error);
  }
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(temp_path.c_str());
    throw std::runtime_error("checkpoint: rename to " + path + ": " + err);
  }
}

void prune_checkpoints(const std::string& directory, int keep) {
  std::error_code ec;
  const auto whole = list_checkpoints(directory);
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1)); i < whole.size(); ++i) {
    remove_tree(whole[i].path);
  }
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 &&
        (name.find(".tmp") != std::string::npos || name.find(".old") != std::string::npos)) {
      remove_tree(entry.path().string());
    }
  }
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void remove_tree(const std::string& path) {
  // Depth first, not following links: files and links are unlinked, directories removed empty.
  ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int type, struct FTW*) {
        if (type == FTW_DP) {
          ::rmdir(entry);
        } else {
          ::unlink(entry);
        }
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace ctrun::worker
