// The root-cause summary printed when a job fails, in torchrun's layout, and the reader of the
// error file a worker writes (torch's @record JSON) whose message it quotes. Beyond torchrun: a
// worker without an error file is explained by the end of its stderr (the traceback Python
// printed), and a worker killed as hung by the stacks taken before the kill.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  std::string stderr_log;                // empty when not written to a file
  std::vector<std::string> stderr_tail;  // the last lines of its stderr (StderrTail)
  bool hung = false;  // killed by --worker_timeout: the error file is the agent's, not the worker's
  std::string native_stacks;  // eu-stack's output taken before that kill, or why there is none
};

// The message of a torch @record error file:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
// or, as C++ workers may write it, {"message": "..."}. nullopt when absent or unreadable.
std::optional<std::string> read_error_file(const std::string& path);

// What the report quotes from a stderr tail: from the last Python traceback (with the
// exceptions chained before it) or faulthandler dump ("Fatal Python error: ...") to the end;
// without one, the last kPlainLines lines.
struct StderrExcerpt {
  static constexpr std::size_t kPlainLines = 20;
  std::vector<std::string> lines;
  bool from_python = false;  // starts at a traceback or a faulthandler dump
};
StderrExcerpt stderr_excerpt(const std::vector<std::string>& tail);

// The exception a Python traceback in the tail ends with ("ValueError: boom"); nullopt without
// a traceback.
std::optional<std::string> exception_from_stderr(const std::vector<std::string>& tail);

// Every rank that failed in the attempt, the first observed first: it is the root cause, the
// others are listed above it ("Failures:"), as torchrun does.
std::string format_failure_report(const std::vector<FailureInfo>& failures);
std::string format_failure_report(const FailureInfo& failure);

// One line for the rendezvous log and the other nodes: who failed and why (the exception of the
// error file or of the stderr's end, else the signal or the exit code).
std::string failure_summary(const FailureInfo& failure);

// What every agent of a failed job logs with that summary: the launcher of --hostfile finds the
// job's failure in its hosts' output by it.
inline constexpr std::string_view kJobFailedLine = "job ended (failed): ";

}  // namespace ctrun::launcher
