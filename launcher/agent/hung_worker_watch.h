// --worker_timeout: the hung-worker watchdog. Often enough to see a hang within a fifth of the
// timeout (every 50 ms to 1 s) it reads when each worker's heartbeat file last changed, and
// HeartbeatMonitor judges; a worker silent for longer is hung. The agent is told (its log line,
// event, error file and the job's hang report); then the worker's native stacks (eu-stack) go to
// its stderr and to the failure report, a Python worker is sent SIGABRT (faulthandler writes its
// Python stacks as it dies), and its process group is SIGKILLed, whose exit restarts the job.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "ctrun/rendezvous/task.h"
#include "launcher/diagnosis/heartbeat_monitor.h"
#include "launcher/workers/heartbeat_files.h"
#include "launcher/workers/worker_runner.h"

namespace ctrun::launcher {

class HungWorkerWatch {
 public:
  struct Hooks {
    std::function<void(const std::string& line)> log;
    // Whether the workers are watched now (they run and are not being stopped).
    std::function<bool()> watching;
    // The worker in words: "worker rank 3 (local rank 1)".
    std::function<std::string(int local_rank)> who;
    // Local rank `local_rank`'s worker (`pid`, 0 when it has just exited) is hung, and `why`;
    // told before anything is done to it.
    std::function<void(int local_rank, int pid, const std::string& why)> found;
    // Whether the job's hang report is still taking the other ranks' stacks: the kill waits for
    // it (bounded), while they still stand where they are.
    std::function<bool()> reporting;
    // Where the worker's stderr goes, in words.
    std::function<std::string(int local_rank)> stderr_place;
    // Whether the workers run Python (faulthandler writes their stacks on SIGABRT).
    std::function<bool()> python;
  };
  struct Settings {
    double timeout = 0;              // --worker_timeout, seconds; 0: not watched
    double hang_report_timeout = 0;  // --hang_report_timeout, seconds
    std::chrono::milliseconds native_stacks_timeout{5000};  // eu-stack's time
    std::chrono::milliseconds python_stacks_timeout{2000};  // faulthandler's time, then SIGKILL
  };

  HungWorkerWatch(boost::asio::io_context& io, Settings settings, WorkerRunner& workers,
                  const HeartbeatFiles& files, Hooks hooks);

  // Watches from now to the agent's end (nothing without a timeout).
  void start();
  // A new group of workers (their files made), or one worker in a rank's place.
  void workers_started();
  void worker_replaced(int local_rank);
  // The native stacks of this group's worker `pid` found hung ("" while they are being taken);
  // nothing when it was not found hung.
  std::optional<std::string> hung_stacks(int pid) const;

 private:
  void arm();
  void check();
  rendezvous::Task<void> kill(int local_rank, int pid);

  boost::asio::io_context& io_;
  Settings settings_;
  WorkerRunner& workers_;
  const HeartbeatFiles& files_;
  Hooks hooks_;
  boost::asio::steady_timer timer_;
  HeartbeatMonitor monitor_;
  std::map<int, std::string> hung_;  // by pid: this group's workers found hung, their stacks
};

}  // namespace ctrun::launcher
