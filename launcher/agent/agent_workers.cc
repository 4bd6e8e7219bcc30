// The agent's workers: each attempt's files and environment, starting, restarting (one worker
// with --fault_tolerance=step) and stopping them, and the failure report of the ranks that
// failed (with the stacks of those hung_worker_watch.h found hung).
#include "launcher/agent/agent_impl.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ctrun/launcher/log_line_prefix.h"
#include "ctrun/launcher/worker_env.h"
#include "launcher/agent/agent_os.h"
#include "launcher/workers/adopted_children.h"
#include "launcher/workers/captured_run.h"
#include "rendezvous/base/log.h"

namespace ctrun::launcher {

namespace {

// How long a failed worker's stderr may take to be read to its end for the report.
constexpr std::chrono::milliseconds kStderrDrainTimeout{2000};

}  // namespace

// The machine does not change while the agent runs, nor does its worker count: one plan.
rdzv::Status Agent::Impl::plan_bindings() {
  auto topology = read_cpu_topology();
  if (!topology) return topology.error();
  std::optional<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) visible = v;
  const int gpus = static_cast<int>(topology.value().gpu_nodes.size());
  auto devices = worker_devices(visible, local_world_size_, gpus);
  if (!devices) return devices.error();
  auto plan = plan_numa_binding(topology.value(), *parse_numa_mode(options_.numa_binding),
                                local_world_size_, devices.value());
  if (!plan) return plan.error();
  bindings_ = std::move(plan).value();
  for (int rank = 0; rank < local_world_size_; ++rank) {
    log("--numa-binding=" + options_.numa_binding + ": local rank " + std::to_string(rank) +
        " on CPUs " + cpu_list_text(bindings_[rank].cpus) + ", memory from NUMA node " +
        std::to_string(bindings_[rank].memory_node) +
        (gpus == 0 ? " (no GPU: workers spread over the NUMA nodes)" : ""));
  }
  return rdzv::ok_status();
}

rdzv::Result<std::shared_ptr<FilteredLog>> Agent::Impl::open_filtered_log(
    int restart_count, const std::string& stream, const std::vector<std::string>& filters) {
  if (filters.empty()) return std::shared_ptr<FilteredLog>();
  const std::string dir = attempt_root(restart_count);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return rdzv::Error{rdzv::ErrorCode::kInternal, "cannot create '" + dir + "': " + ec.message()};
  auto opened = FilteredLog::open(dir + "/filtered_" + stream + ".log", filters);
  if (opened) {
    opened.value()->set_file_error_handler([this, stream](const std::string& path, int error) {
      report_lost_log("the workers' filtered " + stream, path, error, {{"stream", stream}});
    });
  }
  return opened;
}

void Agent::Impl::report_lost_log(const std::string& whose, const std::string& path, int error,
                                  rdzv::Json fields) {
  const std::string why = std::strerror(error);
  log("error: " + whose + ": writing its log file '" + path + "' failed: " + why +
      "; the file is cut short from here on");
  fields["path"] = path;
  fields["error"] = why;
  event("log_lost", std::move(fields));
  lost_logs_.push_back(path);
}

void Agent::Impl::probe_workers_torch() {
  // Only for Python entrypoints, whose workers start that interpreter anyway: an executable's
  // torch cannot be told (a C++ trainer, a wrapper script), and its workers get both names.
  const std::string python_exec = python_executable();
  if (worker_command(options_, python_exec).executable != python_exec) return;
  torch_probe_pending_ = true;
  spawn(read_workers_torch(python_exec));
}

Task<void> Agent::Impl::read_workers_torch(std::string python_exec) {
  const std::vector<std::string> args = {"-c", kTorchVersionProbe};
  const CapturedRun run =
      co_await run_captured(io_.get_executor(), python_exec, args, std::chrono::seconds(10), 4096);
  if (run.succeeded) {
    workers_torch_ = parse_torch_version(run.text);
  } else if (run.started) {
    log("cannot tell which torch the workers have (" + python_exec +
        "): " + (run.timed_out ? std::string("no answer within 10 s") : run.text) +
        "; they get both NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_ASYNC_ERROR_HANDLING");
  }
  torch_probe_pending_ = false;
}

Task<void> Agent::Impl::torch_probed() {
  while (torch_probe_pending_) co_await rdzv::sleep_for(std::chrono::milliseconds(2));
}

// What every worker of an attempt shares: the filtered logs, the command, the environment.
rdzv::Result<Agent::Impl::Attempt> Agent::Impl::prepare_attempt(int restart_count) {
  const LaunchOptions& o = options_;
  Attempt attempt;
  auto stdout_filtered = open_filtered_log(restart_count, "stdout", o.duplicate_stdout_filters);
  if (!stdout_filtered) return stdout_filtered.error();
  auto stderr_filtered = open_filtered_log(restart_count, "stderr", o.duplicate_stderr_filters);
  if (!stderr_filtered) return stderr_filtered.error();
  attempt.stdout_filtered = stdout_filtered.value();
  attempt.stderr_filtered = stderr_filtered.value();
  attempt.set_omp = local_world_size_ > 1 && std::getenv("OMP_NUM_THREADS") == nullptr;
  const std::string python_exec = python_executable();
  attempt.command = worker_command(o, python_exec);
  workers_run_python_ = attempt.command.executable == python_exec;
  attempt.base = current_environment();
  return attempt;
}

// One worker's spec; its files and places are recorded under its local rank.
rdzv::Result<WorkerSpec> Agent::Impl::worker_spec(const Attempt& attempt,
                                                  const rdzv::RoundAssignment& round,
                                                  int restart_count, int local_rank) {
  const LaunchOptions& o = options_;
  const std::size_t slot = static_cast<std::size_t>(local_rank);
  const std::string dir = attempt_dir(restart_count, local_rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return rdzv::Error{rdzv::ErrorCode::kInternal, "cannot create '" + dir + "': " + ec.message()};
  }
  worker_dirs_.at(slot) = dir;
  WorkerEnvInputs in;
  in.options = &o;
  in.run_id = run_id_;
  in.local_world_size = local_world_size_;
  in.local_rank = local_rank;
  in.placement =
      RoundPlacement{round.group_rank,  round.group_world_size, round.rank_offset, round.world_size,
                     round.master_addr, round.master_port,      restart_count};
  in.use_agent_store = use_agent_store();
  in.store = client_->store_address(round.store_prefix);
  in.error_file = dir + "/error.json";
  in.set_omp_num_threads = attempt.set_omp;
  in.python_fault_handler = o.worker_timeout > 0 && workers_run_python_;
  in.torch = workers_torch_;
  in.replica_id = node_id_ + "/" + std::to_string(local_rank);
  if (!o.fault_report.empty()) {
    in.result_file = dir + "/result";
    std::remove(in.result_file.c_str());  // a result is this worker's, never an earlier one's
    if (faults_) faults_->set_result_file(local_rank, in.result_file);
  }
  if (faults_) {
    in.fault_file = dir + "/fault";
    std::remove(in.fault_file.c_str());  // a planned exception is for the process it was sent to
  }
  in.python_helper_dir = python_helper_dir_;
  in.worker_proxy = worker_proxy_;
  if (!python_helper_dir_.empty() && workers_run_python_) {
    // Made by the worker's sitecustomize.py once its handler is registered: not before.
    in.stacks_file = dir + "/python_stacks";
    in.stacks_signal = NodeStacks::signal();
    std::remove(in.stacks_file.c_str());
    stacks_->set_stacks_file(local_rank, in.stacks_file);
  }
  if (o.flight_recorder) in.flight_recorder_prefix = NodeStacks::flight_recorder_prefix(dir);
  if (file_timer_) in.timer_file = file_timer_->path();
  if (heartbeat_files_on()) {
    in.heartbeat_file = dir + "/heartbeat";
    heartbeat_files_.create(local_rank, in.heartbeat_file);
  }

  WorkerSpec spec;
  spec.local_rank = local_rank;
  spec.command = attempt.command;
  spec.env = worker_environment(attempt.base, in);
  spec.prefix = console_prefix(o.log_line_prefix_template, o.role, round.rank_offset + local_rank,
                               local_rank);
  const bool console =
      o.local_ranks_filter.empty() ||
      std::count(o.local_ranks_filter.begin(), o.local_ranks_filter.end(), local_rank) > 0;
  const bool implicit_tee = !o.log_dir.empty() && o.redirects.empty() && o.tee.empty();
  const int redirect = o.redirects.for_rank(local_rank);
  const int tee = implicit_tee ? 3 : o.tee.for_rank(local_rank);
  const int to_file = redirect | tee;
  spec.stdout_file = (to_file & 1) ? dir + "/stdout.log" : "";
  spec.stderr_file = (to_file & 2) ? dir + "/stderr.log" : "";
  spec.stdout_console = console && !((redirect & 1) && !(tee & 1)) ? 1 : -1;
  spec.stderr_console = console && !((redirect & 2) && !(tee & 2)) ? 2 : -1;
  // Only console lines are copied (OutputSink), so ranks and streams kept off the console add
  // nothing, as under torchrun where the copy follows --tee.
  spec.stdout_filtered = attempt.stdout_filtered;
  spec.stderr_filtered = attempt.stderr_filtered;
  stderr_files_.at(slot) = spec.stderr_file;
  stderr_places_.at(slot) = !spec.stderr_file.empty() ? spec.stderr_file
                            : spec.stderr_console >= 0
                                ? "the console"
                                : "nowhere (--redirects/--local_ranks_filter)";
  if (!bindings_.empty()) spec.binding = bindings_[slot];
  return spec;
}

rdzv::Status Agent::Impl::start_workers(const rdzv::RoundAssignment& round, int restart_count) {
  auto attempt = prepare_attempt(restart_count);
  if (!attempt) return attempt.error();
  const auto n = static_cast<std::size_t>(local_world_size_);
  heartbeat_files_.reset(heartbeat_files_on() ? local_world_size_ : 0);
  stacks_->reset(local_world_size_);
  hang_report_text_.clear();  // a report of an earlier attempt's hang is not this one's
  stderr_files_.assign(n, "");
  stderr_places_.assign(n, "");
  worker_dirs_.assign(n, "");
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
    auto spec = worker_spec(attempt.value(), round, restart_count, local_rank);
    if (!spec) return spec.error();
    specs.push_back(std::move(spec).value());
  }
  hung_workers_->workers_started();
  workers_->set_log_error_handler([this, offset = round.rank_offset](
                                      int local_rank, const std::string& path, int error) {
    const int rank = offset + local_rank;
    report_lost_log(
        "worker rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + ")",
        path, error, {{"rank", rank}, {"local_rank", local_rank}});
  });
  auto started = workers_->start(std::move(specs), [this](const WorkerExit& e) {
    if (faults_) faults_->worker_ended(e);
    post({.kind = AgentInput::Kind::kWorkerExit, .exit = e});
  });
  if (started) {
    event("workers_started",
          {{"round", round.round}, {"restart", restart_count}, {"pids", workers_->pids()}});
    if (stragglers_)
      stragglers_->workers_started(round, local_world_size_, rdzv::local_host_name());
    if (faults_) {
      faults_->workers_started(round, local_world_size_, restart_count, server_ != nullptr);
    }
  }
  return started;
}

// --fault_tolerance=step: one worker again, in the round the node is in now; the others run on.
rdzv::Status Agent::Impl::restart_worker(int local_rank, int restart_count) {
  const rdzv::RoundAssignment& round = machine_->round();
  auto attempt = prepare_attempt(restart_count);
  if (!attempt) return attempt.error();
  auto spec = worker_spec(attempt.value(), round, restart_count, local_rank);
  if (!spec) return spec.error();
  if (heartbeat_files_on()) hung_workers_->worker_replaced(local_rank);
  auto started = workers_->restart(std::move(spec).value());
  if (started && stragglers_) stragglers_->worker_replaced(local_rank);
  if (started && faults_) faults_->worker_replaced(local_rank, restart_count);
  if (started) {
    event("worker_restarted", {{"local_rank", local_rank},
                               {"restart", restart_count},
                               {"pid", workers_->running_pid(local_rank)}});
  }
  return started;
}

// Always through WorkerGroup::stop, even when no worker is left running: the process groups may
// still hold a failed worker's children (data loaders, compilers), which must go too.
Task<void> Agent::Impl::stop_workers(int signo) {
  asio::steady_timer done(io_, asio::steady_timer::time_point::max());
  bool stopped = false;
  if (stragglers_) stragglers_->workers_stopped();
  // Their GPU memory is waited for before the next join.
  if (health_) health_->workers_stopped(workers_->pids());
  workers_->stop(
      signo,
      std::chrono::duration_cast<std::chrono::milliseconds>(seconds(options_.shutdown_timeout)),
      [&] {
        stopped = true;
        done.cancel();
      });
  if (faults_) faults_->workers_stopping();
  while (!stopped) co_await done.async_wait(asio::as_tuple(asio::use_awaitable));
  if (file_timer_) file_timer_->clear();  // the timers of workers that are no more
  // What the workers left that escaped their process groups (a setsid daemon) goes too.
  if (world_.adopt_orphans) kill_adopted_children(workers_->pids());
}

void Agent::Impl::say_lost_logs() const {
  if (lost_logs_.empty()) return;
  std::string paths;
  for (const auto& p : lost_logs_) paths += (paths.empty() ? "" : ", ") + p;
  log("warning: " + std::to_string(lost_logs_.size()) +
      " log files are cut short (a write failed, see above): " + paths);
}

FailureInfo Agent::Impl::failure_info(const WorkerExit& exit) const {
  FailureInfo info;
  info.entrypoint = options_.entrypoint;
  info.host = rdzv::local_host_name();
  info.rank = machine_->round().rank_offset + exit.local_rank;
  info.local_rank = exit.local_rank;
  info.pid = exit.pid;
  info.exit_code = exit.exit_code;
  info.signal = exit.signal;
  info.at = exit.at;
  info.error_file = worker_dir(exit.local_rank) + "/error.json";
  info.stderr_tail = workers_->stderr_tail(exit.local_rank);
  if (static_cast<std::size_t>(exit.local_rank) < stderr_files_.size()) {
    info.stderr_log = stderr_files_[static_cast<std::size_t>(exit.local_rank)];
  }
  if (auto stacks = hung_workers_->hung_stacks(exit.pid)) {
    info.hung = true;
    info.native_stacks = *stacks;
  }
  return info;
}

Task<void> Agent::Impl::report_failure(WorkerExit first) {
  // Every rank that failed in this attempt, the first observed first (the root cause); what
  // each wrote before it died (a traceback, faulthandler's stacks) is read to its end.
  std::vector<WorkerExit> failed{first};
  for (const WorkerExit& other : workers_->failures()) {
    if (other.pid != first.pid) failed.push_back(other);
  }
  const auto drained = std::chrono::steady_clock::now() + kStderrDrainTimeout;
  for (const WorkerExit& f : failed) {
    while (!workers_->stderr_closed(f.local_rank) && std::chrono::steady_clock::now() < drained) {
      co_await rdzv::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::vector<FailureInfo> infos;
  for (const WorkerExit& f : failed) infos.push_back(failure_info(f));
  std::string report = format_failure_report(infos);
  report += std::exchange(hang_report_text_, "");
  std::fputs(report.c_str(), stderr);
  say_lost_logs();
  // Built before the co_await: g++ 12 mishandles conditional temporaries inside its operand.
  std::string summary = failure_summary(infos.front());
  if (infos.size() > 1) summary += " (and " + std::to_string(infos.size() - 1) + " more ranks)";
  event("job_end", {{"state", "failed"}, {"reason", summary}});
  log(std::string(kJobFailedLine) + summary);  // as the other nodes' agents log it
  (void)co_await client_->report(false, summary);
  // Let the job's end reach the other nodes.
  co_await rdzv::sleep_for(std::chrono::milliseconds(200));
  post({.kind = AgentInput::Kind::kRendezvousTold});
}

}  // namespace ctrun::launcher
