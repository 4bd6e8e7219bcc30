// Test helper: workers in memory for the agent's shell (AgentWorld::make_workers). Each start()
// is recorded as an attempt with the specs the agent built (their environments say ranks, world
// size, restart count); the test's script, run at each start, says how the workers end. Exits
// arrive on the event loop, as the pidfd events of real workers do; stop() ends every running
// worker by its signal, which is not a failure.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/workers/worker_runner.h"

namespace ctrun::testing {

using launcher::WorkerExit;
using launcher::WorkerRunner;
using launcher::WorkerSpec;

class FakeWorkers;

// What the test sees and decides; it outlives the runner the agent owns.
struct WorkerScript {
  // Called (on the loop) after each start, with the attempt's number from 0.
  std::function<void(FakeWorkers& workers, int attempt)> on_start;
  // Called (on the loop) after a restart of one worker, with its local rank and generation.
  std::function<void(FakeWorkers& workers, int local_rank, int generation)> on_restart;
  std::vector<std::vector<WorkerSpec>> attempts;
  std::vector<int> stop_signals;                   // each stop()'s signal
  std::vector<std::pair<int, int>> killed;         // kill(): (local rank, signal)
  std::vector<std::pair<int, std::string>> notes;  // write_stderr_note()
  std::vector<WorkerSpec> restarts;                // restart(), in order
};

// The value of `name` in a worker's environment ("" when absent).
inline std::string env_value(const WorkerSpec& spec, const std::string& name) {
  for (const auto& entry : spec.env) {
    if (entry.compare(0, name.size() + 1, name + "=") == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

class FakeWorkers final : public WorkerRunner {
 public:
  FakeWorkers(boost::asio::io_context& io, std::shared_ptr<WorkerScript> script)
      : io_(io), script_(std::move(script)) {}

  // Worker `local_rank` of the running attempt ends with `code`, or by `signal`.
  void exit(int local_rank, int code, int signal = 0) {
    const int attempt = attempt_;
    boost::asio::post(
        io_, [this, local_rank, code, signal, attempt, alive = std::weak_ptr<int>(alive_)] {
          if (alive.expired() || attempt != attempt_ || !running_.count(local_rank)) return;
          end(local_rank, code, signal, stopping_);
        });
  }
  int attempt() const { return attempt_; }

  rendezvous::Status start(std::vector<WorkerSpec> specs, ExitHandler on_exit) override {
    on_exit_ = std::move(on_exit);
    stopping_ = false;
    running_.clear();
    failures_.clear();
    generation_.clear();
    for (const auto& spec : specs) running_.insert(spec.local_rank);
    script_->attempts.push_back(std::move(specs));
    attempt_ = static_cast<int>(script_->attempts.size()) - 1;
    boost::asio::post(io_, [this, attempt = attempt_, alive = std::weak_ptr<int>(alive_)] {
      if (!alive.expired() && attempt == attempt_ && script_->on_start) {
        script_->on_start(*this, attempt);
      }
    });
    return rendezvous::ok_status();
  }
  void stop(int signo, std::chrono::milliseconds, std::function<void()> done) override {
    script_->stop_signals.push_back(signo);
    stopping_ = true;
    for (int rank : std::set<int>(running_)) end(rank, 0, signo, true);
    boost::asio::post(io_, std::move(done));
  }
  // One worker again: a new attempt of its own for the script (on_start with that number), the
  // others untouched.
  rendezvous::Status restart(WorkerSpec spec) override {
    if (running_.count(spec.local_rank)) {
      return rendezvous::Error{rendezvous::ErrorCode::kInternal, "restart of a running worker"};
    }
    script_->restarts.push_back(spec);
    running_.insert(spec.local_rank);
    const int generation = ++generation_[spec.local_rank];
    boost::asio::post(
        io_, [this, rank = spec.local_rank, generation, alive = std::weak_ptr<int>(alive_)] {
          if (!alive.expired() && script_->on_restart) script_->on_restart(*this, rank, generation);
        });
    return rendezvous::ok_status();
  }
  // The replaced worker's generation (0: the first process of the attempt).
  int generation(int local_rank) const {
    auto it = generation_.find(local_rank);
    return it == generation_.end() ? 0 : it->second;
  }
  void kill(int local_rank, int signo) override {
    script_->killed.emplace_back(local_rank, signo);
    exit(local_rank, 0, signo);
  }
  void kill_all() override { running_.clear(); }
  void signal_process(int local_rank, int signo) override { kill(local_rank, signo); }
  int running_pid(int local_rank) const override {
    return running_.count(local_rank) ? pid_of(local_rank) : 0;
  }
  std::vector<std::string> stderr_tail(int) const override { return {}; }
  bool stderr_closed(int) const override { return true; }
  void write_stderr_note(int local_rank, const std::string& text) override {
    script_->notes.emplace_back(local_rank, text);
  }
  void set_log_error_handler(LogErrorHandler) override {}
  std::vector<WorkerExit> failures() const override { return failures_; }
  std::size_t running() const override { return running_.size(); }
  std::vector<int> pids() const override {
    std::vector<int> out;
    for (int rank : running_) out.push_back(pid_of(rank));
    return out;
  }

 private:
  // Numbers no process has (above Linux's largest pid_max): nothing the agent sends them can
  // reach a real process.
  int pid_of(int local_rank) const {
    return 5'000'000 + attempt_ * 1000 + generation(local_rank) * 100 + local_rank;
  }

  void end(int local_rank, int code, int signal, bool by_stop) {
    running_.erase(local_rank);
    WorkerExit e;
    e.local_rank = local_rank;
    e.pid = pid_of(local_rank);
    e.exit_code = code;
    e.signal = signal;
    e.at = std::chrono::system_clock::now();
    if (by_stop) return;
    if (!e.ok()) failures_.push_back(e);
    if (on_exit_) on_exit_(e);
  }

  boost::asio::io_context& io_;
  std::shared_ptr<WorkerScript> script_;
  ExitHandler on_exit_;
  std::set<int> running_;
  std::map<int, int> generation_;  // by local rank, in this attempt
  std::vector<WorkerExit> failures_;
  int attempt_ = -1;
  bool stopping_ = false;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace ctrun::testing
