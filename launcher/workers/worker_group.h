// The local workers of one round as processes (WorkerRunner): started with child_process, each
// in its own process group and killed if the agent dies (PR_SET_PDEATHSIG); exits arrive as
// events the moment they happen (pidfd-based async wait, no polling); stopped with a signal, a
// grace period, then SIGKILL to every process group.
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

#include "launcher/workers/worker_runner.h"

namespace ctrun::launcher {

class WorkerGroup final : public WorkerRunner {
 public:
  explicit WorkerGroup(boost::asio::io_context& io);
  ~WorkerGroup() override;  // SIGKILLs every process group still there
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  rendezvous::Status start(std::vector<WorkerSpec> specs, ExitHandler on_exit) override;
  void stop(int signo, std::chrono::milliseconds grace, std::function<void()> done) override;
  rendezvous::Status restart(WorkerSpec spec) override;
  void kill(int local_rank, int signo) override;
  void kill_all() override { kill_groups(SIGKILL); }
  void signal_process(int local_rank, int signo) override;
  int running_pid(int local_rank) const override;
  std::vector<std::string> stderr_tail(int local_rank) const override;
  bool stderr_closed(int local_rank) const override;
  void write_stderr_note(int local_rank, const std::string& text) override;
  void set_log_error_handler(LogErrorHandler handler) override {
    on_log_error_ = std::move(handler);
  }
  std::vector<WorkerExit> failures() const override;
  std::size_t running() const override;
  std::vector<int> pids() const override;

 private:
  struct Worker;
  // Fails with the numbers when RLIMIT_NOFILE cannot cover the workers' descriptors; raises the
  // agent's soft limit (up to the hard one) when that is enough.
  rendezvous::Status ensure_descriptors(const std::vector<WorkerSpec>& specs);
  Worker* find(int local_rank) const;
  // Starts one worker, its output pumped and its exit awaited.
  rendezvous::Result<std::shared_ptr<Worker>> launch(const WorkerSpec& spec);
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
