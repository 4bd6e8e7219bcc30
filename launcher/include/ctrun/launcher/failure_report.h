// The root-cause summary printed when a job fails, in torchrun's layout, and the reader of the
// error file a worker writes (torch's @record JSON) whose message it quotes.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace ctrun::launcher {

struct FailureInfo {
  std::string entrypoint;
  std::string host;
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;
  int signal = 0;
  std::chrono::system_clock::time_point at;
  std::string error_file;
  std::string stderr_log;  // empty when not written to a file
};

// The message of a torch @record error file:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
// or, as C++ workers may write it, {"message": "..."}. nullopt when absent or unreadable.
std::optional<std::string> read_error_file(const std::string& path);

std::string format_failure_report(const FailureInfo& failure);

}  // namespace ctrun::launcher
