// The local workers of one round, as the agent drives them: start, stop, signal, and what they
// left (exits, stderr tails). WorkerGroup runs them as processes; tests give the agent an
// in-memory runner (tests/launcher/agent/fake_workers.h), so that its shell is tested without
// processes.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/launcher/worker_env.h"
#include "ctrun/rendezvous/error.h"
#include "launcher/workers/filtered_log.h"
#include "launcher/workers/numa_binding.h"
#include "launcher/workers/worker_exit.h"

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

class WorkerRunner {
 public:
  using ExitHandler = std::function<void(const WorkerExit&)>;

  virtual ~WorkerRunner() = default;

  // Starts every worker; on an error (executable not found, fork failed) starts none and
  // kills any already started. `on_exit` runs for each exit outside stop().
  virtual rendezvous::Status start(std::vector<WorkerSpec> specs, ExitHandler on_exit) = 0;
  // Sends `signo` to every worker's process group, waits up to `grace`, SIGKILLs what is left,
  // then calls `done` once every worker has exited.
  virtual void stop(int signo, std::chrono::milliseconds grace, std::function<void()> done) = 0;
  // Starts one worker in place of local rank `spec.local_rank`, which has exited; the others run
  // on, and its exit arrives through the same handler (--fault_tolerance=step).
  virtual rendezvous::Status restart(WorkerSpec spec) = 0;
  // Sends `signo` to one worker's process group (a hung worker, a forwarded SIGUSR1); an exit
  // it causes arrives as usual.
  virtual void kill(int local_rank, int signo) = 0;
  // SIGKILL to every worker's process group at once, as the destructor does (the agent exiting
  // on a second stop signal).
  virtual void kill_all() = 0;
  // Sends `signo` to the worker process alone, not its children (SIGABRT for faulthandler).
  virtual void signal_process(int local_rank, int signo) = 0;
  // The worker's pid while it runs; 0 once it exited (or with no such worker).
  virtual int running_pid(int local_rank) const = 0;
  // The last lines of the worker's stderr (StderrTail), and whether its stderr has ended: all
  // it wrote before exiting has been read.
  virtual std::vector<std::string> stderr_tail(int local_rank) const = 0;
  virtual bool stderr_closed(int local_rank) const = 0;
  // The agent's text about the worker into the worker's stderr destinations (console, file);
  // not into its tail.
  virtual void write_stderr_note(int local_rank, const std::string& text) = 0;
  // Told once per worker and stream when writing its log file fails (the file is given up; the
  // console goes on).
  using LogErrorHandler = std::function<void(int local_rank, const std::string& path, int error)>;
  virtual void set_log_error_handler(LogErrorHandler handler) = 0;
  // Every worker of this group that failed on its own, in the order their exits were seen: a
  // non-zero exit or a signal before stop(), or an exit that had already happened (not yet
  // reaped) when stop() signalled. Exits caused by stop() are not failures.
  virtual std::vector<WorkerExit> failures() const = 0;
  virtual std::size_t running() const = 0;
  virtual std::vector<int> pids() const = 0;
};

}  // namespace ctrun::launcher
