// The timers of torch's file timer (torch.distributed.elastic.timer.FileTimerClient): what a
// worker asks for on the agent's pipe, and which of its timers have expired. Pure: the pipe and
// the signals are file_timer_server.h's, the clock the caller's (wall time, as the requests'
// expiration times are).
//
// A request is one JSON line of at most PIPE_BUF bytes, so that writers never interleave:
//   {"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": 1764288000.5,
//    "signal": 9}
// An expiration time below 0 releases the pid's timer of that scope; a signal of 0 or less
// expires without a kill (torch's client sends its signal, SIGKILL by default).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

struct FileTimerRequest {
  int pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // seconds since the epoch; below 0: a release
  int signal = 0;
};

// One request line (without its newline); an error naming what is wrong with it.
rendezvous::Result<FileTimerRequest> parse_file_timer_request(std::string_view line);

// Scopes as torch's server logs them: "['step', 'load']".
std::string scope_list(const std::vector<std::string>& scopes);

// A worker whose timers expired: every expired scope, earliest first, and the signal of the
// earliest that has one (0: none has, and the worker is left alone, as torch does).
struct FileTimerExpiry {
  int pid = 0;
  std::vector<std::string> scopes;
  int signal = 0;
  std::string signal_scope;  // the scope whose signal is sent
};

class FileTimers {
 public:
  // Sets (or replaces) the timer of the request's pid and scope, or releases it.
  void apply(const FileTimerRequest& request);
  // The workers with a timer at or past `now`, each once, ordered by pid. Their timers are
  // forgotten: a worker is reaped for them once, as torch's server clears a reaped pid.
  std::vector<FileTimerExpiry> take_expired(double now);
  // Forgets every timer of `pid` (the process is gone) or all of them (the workers stopped).
  void forget(int pid);
  void clear() { timers_.clear(); }
  std::size_t size() const { return timers_.size(); }
  std::vector<int> pids() const;

 private:
  struct Timer {
    double expiration_time = 0;
    int signal = 0;
  };
  std::map<std::pair<int, std::string>, Timer> timers_;
};

}  // namespace ctrun::launcher
