// The workers' heartbeat files (CTRUN_HEARTBEAT_FILE), by local rank: a worker rewrites its
// file as it beats, with the step it reached as the first thing in it. The one reader of them
// for the agent's watchers: the hung-worker watchdog reads when a file last changed, and the
// faults planned at a step, the fault report, the straggler watch and hang reports read the step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ctrun::launcher {

// A file's modification time in nanoseconds, as an opaque stamp; 0 when it cannot be read.
std::int64_t modification_stamp(const std::string& path);

class HeartbeatFiles {
 public:
  // A new group of `local_world_size` workers, none with a file yet.
  void reset(int local_world_size) {
    paths_.assign(static_cast<std::size_t>(local_world_size), "");
  }
  // Local rank `local_rank`'s file is `path`, made empty now (a new worker's first beat is a
  // change of it); false when it cannot be made.
  bool create(int local_rank, const std::string& path);
  // What that worker last wrote: its step, and where it measures them the nanoseconds it has
  // waited for its peers in collectives so far (ctrun_worker, libctrun_worker: "12 3400000").
  struct Progress {
    std::int64_t step = 0;
    std::optional<std::int64_t> waited_ns;
  };
  // Nothing when it has no file or the file holds no number (never written, or caught between
  // its truncation and its write).
  std::optional<Progress> progress(int local_rank) const;
  // The step alone.
  std::optional<std::int64_t> step(int local_rank) const {
    auto p = progress(local_rank);
    return p ? std::optional<std::int64_t>(p->step) : std::nullopt;
  }
  // When its file last changed, as an opaque stamp (nanoseconds); 0 when it cannot be read.
  std::int64_t stamp(int local_rank) const;
  // Every file's stamp, by local rank.
  std::vector<std::int64_t> stamps() const;
  int size() const { return static_cast<int>(paths_.size()); }

 private:
  const std::string* path_of(int local_rank) const;

  std::vector<std::string> paths_;  // by local rank; "" none
};

// A heartbeat file's text read: "STEP" or "STEP WAITED_NS", blanks after it (a record written
// at a fixed width) or not; nothing without a leading number.
std::optional<HeartbeatFiles::Progress> parse_progress(const std::string& text);

}  // namespace ctrun::launcher
