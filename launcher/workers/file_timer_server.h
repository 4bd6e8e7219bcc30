// TORCHELASTIC_ENABLE_FILE_TIMER=1: the agent's end of torch's file timer. Workers using
// torch.distributed.elastic.timer's FileTimerClient (`expires(after=...)`) write their timers
// into a named pipe (TORCHELASTIC_TIMER_FILE); a worker process whose timer expires is sent the
// signal it asked for (SIGKILL by default), checked every 100 ms as torch's agent does. Only a
// process of one of this agent's workers' process groups is ever signalled: the pipe is the
// agent's user's alone (mode 0600), and a pid from elsewhere is named, not killed. The timers'
// bookkeeping is file_timers.h's.
#pragma once

#include <boost/asio/io_context.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

// A worker's process signalled for its expired timers.
struct FileTimerReap {
  int local_rank = 0;  // the worker whose process group holds the process
  int pid = 0;         // the process that asked for the timers (the worker, or a child of it)
  std::vector<std::string> scopes;  // every expired scope, earliest first
  int signal = 0;
  std::string signal_scope;  // the scope whose signal was sent
};

class FileTimerServer {
 public:
  struct Hooks {
    // The local rank of the running worker whose process group is `pgid`, if any.
    std::function<std::optional<int>(int pgid)> worker_of_group;
    std::function<void(const FileTimerReap&)> reaped;
    std::function<void(const std::string&)> say;  // a line for the agent's log
    // Seconds since the epoch (the requests' clock); default: the system clock.
    std::function<double()> now;
  };

  // Makes the pipe at `path` (what is there is removed first, as torch does) and opens it.
  static rendezvous::Result<std::unique_ptr<FileTimerServer>> create(boost::asio::io_context& io,
                                                                     const std::string& path,
                                                                     Hooks hooks);
  ~FileTimerServer();  // the pipe is removed
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const;
  // Forgets every timer: the workers that set them were stopped.
  void clear();

 private:
  class Impl;
  explicit FileTimerServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// Where the pipe goes when TORCHELASTIC_TIMER_FILE does not say: the temporary directory's
// watchdog_timer_<uuid4>, torch's name.
std::string default_file_timer_path(const std::string& uuid);

}  // namespace ctrun::launcher
