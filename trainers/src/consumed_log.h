// --consumed_log: one line per committed step, "<who> <epoch> <step> <unix ms> <pid> <index>
// ...", and "<who> fault <unix ms> <pid> <steps committed>" when a worker injects its death. With
// --fault_tolerant <who> is the replica and the indices are the whole quorum's samples of the step;
// otherwise it is "rank<R>" with that rank's share. Tests prove from it that each sample of an
// epoch was trained exactly once; benchmarks time the steps around a fault. One write per line
// (O_APPEND), so workers may share the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ctrun::trainers {

class ConsumedLog {
 public:
  // Empty path: writes nothing. Throws std::runtime_error naming the file it cannot open.
  explicit ConsumedLog(const std::string& path);
  ~ConsumedLog();
  ConsumedLog(const ConsumedLog&) = delete;
  ConsumedLog& operator=(const ConsumedLog&) = delete;

  bool enabled() const { return fd_ >= 0; }
  void commit(const std::string& who, std::uint64_t epoch, std::int64_t step,
              const std::vector<std::uint64_t>& indices);
  void fault(const std::string& who, std::int64_t committed_steps);

 private:
  void write(const std::string& line);
  int fd_ = -1;
};

}  // namespace ctrun::trainers
