// The local workers of one round: started with Boost.Process v2, each in its own process group
// and killed if the agent dies (PR_SET_PDEATHSIG); exits arrive as events the moment they
// happen (pidfd-based async wait, no polling); stopped with a signal, a grace period, then
// SIGKILL to every process group.
#pragma once

#include <sys/resource.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/launcher/worker_env.h"
#include "ctrun/rendezvous/error.h"
#include "filtered_log.h"
#include "numa_binding.h"
#include "worker_exit.h"

namespace ctrun::launcher {

struct WorkerSpec {
  int local_rank = 0;
  WorkerCommand command;
  std::vector<std::string> env;
  int stdout_console = 1;  // fd for prefixed console lines, or -1
  int stderr_console = 2;
  std::string stdout_file;  // empty: no file
  std::string stderr_file;
  std::string prefix;  // "[default0]:"
  // --duplicate-std{out,err}-filters: the attempt's file shared by every local rank, offered
  // each line the stream writes to the console; null: none.
  std::shared_ptr<FilteredLog> stdout_filtered;
  std::shared_ptr<FilteredLog> stderr_filtered;
  std::optional<CpuBinding> binding;  // --numa-binding: set between fork and exec
};

class WorkerGroup {
 public:
  using ExitHandler = std::function<void(const WorkerExit&)>;

  explicit WorkerGroup(boost::asio::io_context& io);
  ~WorkerGroup();  // SIGKILLs every process group still there
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts every worker; on an error (executable not found, fork failed) starts none and
  // kills any already started. `on_exit` runs for each exit outside stop().
  rendezvous::Status start(std::vector<WorkerSpec> specs, ExitHandler on_exit);
  // Sends `signo` to every worker's process group, waits up to `grace`, SIGKILLs what is left,
  // then calls `done` once every worker has exited.
  void stop(int signo, std::chrono::milliseconds grace, std::function<void()> done);
  // Sends `signo` to one worker's process group (a hung worker, a forwarded SIGUSR1); an exit
  // it causes arrives as usual.
  void kill(int local_rank, int signo);
  // SIGKILL to every worker's process group at once, as the destructor does (the agent exiting
  // on a second stop signal).
  void kill_all() { kill_groups(SIGKILL); }
  // Sends `signo` to the worker process alone, not its children (SIGABRT for faulthandler).
  void signal_process(int local_rank, int signo);
  // The worker's pid while it runs; 0 once it exited (or with no such worker).
  int running_pid(int local_rank) const;
  // The last lines of the worker's stderr (StderrTail), and whether its stderr has ended: all
  // it wrote before exiting has been read.
  std::vector<std::string> stderr_tail(int local_rank) const;
  bool stderr_closed(int local_rank) const;
  // The agent's text about the worker into the worker's stderr destinations (console, file);
  // not into its tail.
  void write_stderr_note(int local_rank, const std::string& text);
  // Told once per worker and stream when writing its log file fails (the file is given up; the
  // console goes on).
  using LogErrorHandler = std::function<void(int local_rank, const std::string& path, int error)>;
  void set_log_error_handler(LogErrorHandler handler) { on_log_error_ = std::move(handler); }
  // Every worker of this group that failed on its own, in the order their exits were seen: a
  // non-zero exit or a signal before stop(), or an exit that had already happened (not yet
  // reaped) when stop() signalled. Exits caused by stop() are not failures.
  std::vector<WorkerExit> failures() const;
  std::size_t running() const;
  std::vector<int> pids() const;

 private:
  struct Worker;
  // Fails with the numbers when RLIMIT_NOFILE cannot cover the workers' descriptors; raises the
  // agent's soft limit (up to the hard one) when that is enough.
  rendezvous::Status ensure_descriptors(const std::vector<WorkerSpec>& specs);
  Worker* find(int local_rank) const;
  void on_worker_exit(Worker& w, int native_status);
  void check_stopped();
  void kill_groups(int signo);

  boost::asio::io_context& io_;
  std::vector<std::shared_ptr<Worker>> workers_;
  ExitHandler on_exit_;
  LogErrorHandler on_log_error_;
  bool stopping_ = false;
  std::optional<rlimit> user_open_files_;  // set once the agent raised its own limit
  std::uint64_t exits_seen_ = 0;
  std::function<void()> stopped_;
  boost::asio::steady_timer grace_timer_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace ctrun::launcher
