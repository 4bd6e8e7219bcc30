// The agent's inside (agent.h's Agent::Impl), private to the agent's files: agent.cc runs the
// machine's loop and talks to the rendezvous, agent_workers.cc starts, watches and stops the
// workers and reports their failures, agent_watchdogs.cc starts the services beside them (file
// timer, health port, straggler watch, node health); --faults is FaultRunner's (fault_runner.h).
#pragma once

#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ctrun/launcher/failure_report.h"
#include "ctrun/launcher/worker_env.h"
#include "ctrun/rendezvous/endpoint.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/agent_machine.h"
#include "launcher/agent/agent_os.h"
#include "launcher/agent/fault_runner.h"
#include "launcher/agent/hung_worker_watch.h"
#include "launcher/agent/node_stacks.h"
#include "launcher/diagnosis/dump_watch.h"
#include "launcher/diagnosis/node_health.h"
#include "launcher/diagnosis/straggler_watch.h"
#include "launcher/workers/file_timer_server.h"
#include "launcher/workers/filtered_log.h"
#include "launcher/workers/heartbeat_files.h"
#include "launcher/workers/numa_binding.h"
#include "launcher/workers/worker_runner.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/base/event_log.h"
#include "rendezvous/daemon/http_server.h"
#include "rendezvous/daemon/server.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;
using rdzv::Task;

class Agent::Impl {
 public:
  Impl(asio::io_context& io, LaunchOptions options, int local_world_size, AgentWorld world);

  // Runs the job on the loop until the machine says exit; the agent's exit code.
  int run();

 private:
  // ---- agent.cc: the loop, the machine's actions, the rendezvous ----
  static void log(const std::string& line);
  static rdzv::Duration seconds(double s);
  // The job, then a goodbye to the rendezvous so that it lets this node go at once.
  Task<int> main();
  // Feeds the machine what happens and carries out what it decides, until it says exit.
  Task<int> run_job();
  // What needs no waiting: directories, token, bindings, the backend (and the rendezvous this
  // agent hosts). Then connect(): the backend reached and the job's budget set, as a task.
  rdzv::Status setup();
  Task<void> connect();
  rdzv::Status host_rendezvous();
  rdzv::Status host_standalone();
  bool use_agent_store() const;  // TORCHELASTIC_USE_AGENT_STORE
  // One action of the machine; the agent's exit code when it is kExit.
  Task<std::optional<int>> perform(AgentAction action);
  Task<AgentInput> next_input();
  // After a lost connection: connect again (retrying up to join_timeout) and take this node's
  // place up again; where it finds the node is the machine's to judge.
  Task<void> reconnect();
  Task<void> await_failure_window();
  void begin_join();
  void arm_signals();
  // --stop_on_stdin_close: the end of standard input is a SIGTERM.
  void watch_stdin();
  void arm_adopted_reaping();
  // Every kWaitingLineInterval while the agent waits (to connect, for a round, to reconnect,
  // for the other nodes to finish): a line saying what for, how long, and why.
  void arm_waiting_line();
  void say_what_it_waits_for();
  rdzv::Status open_event_logs() {
    if (options_.event_log.empty()) return rdzv::ok_status();
    auto opened = rdzv::EventLog::open(options_.event_log, "ctrun");
    if (!opened) return opened.error();
    event_log_ = std::move(opened).value();
    auto hosted = rdzv::EventLog::open(options_.event_log, "ctrun rendezvous");
    if (!hosted) return hosted.error();
    server_event_log_ = std::move(hosted).value();
    return rdzv::ok_status();
  }
  rdzv::EventSink hosted_events() {
    return server_event_log_ ? server_event_log_->sink() : rdzv::EventSink();
  }
  void announce_start() {
    const LaunchOptions& o = options_;
    event("agent_start", {{"node_host", host_},
                          {"local_world_size", local_world_size_},
                          {"min_nodes", o.min_nodes},
                          {"max_nodes", o.max_nodes},
                          {"max_restarts", o.max_restarts},
                          {"entrypoint", o.entrypoint},
                          {"rendezvous", rdzv::format_endpoint({endpoint_host_, endpoint_port_})}});
  }
  // A structured event for --event_log, with the job and this node's id.
  void event(const std::string& name, rdzv::Json fields = rdzv::Json::object()) {
    if (!event_log_) return;
    fields["job"] = run_id_;
    fields["node"] = node_id_;
    event_log_->write(name, std::move(fields));
  }
  void post(AgentInput input) {
    if (exiting_) return;  // a task that finished after the machine said exit
    inputs_.push_back(std::move(input));
    wake_.cancel();
  }
  // Spawned on the loop; its outcome comes back as an input. A lambda is passed uncalled:
  // co_spawn keeps it, and so its captures, alive while the coroutine runs.
  void spawn(Task<void> task) { asio::co_spawn(io_, std::move(task), asio::detached); }
  template <typename Coroutine>
  void spawn(Coroutine coroutine) {
    asio::co_spawn(io_, std::move(coroutine), asio::detached);
  }
  // At the agent's end, also when it then re-raises a signal (no destructor runs): the file
  // timer's pipe goes, and the health port closes.
  void cleanup() {
    file_timer_.reset();
    health_server_.reset();
    if (stragglers_) stragglers_->workers_stopped();
    if (!temp_root_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(temp_root_, ec);
    }
  }

  // ---- agent_workers.cc: the workers' files, start, restart, stop, watchdog, failures ----
  rdzv::Status plan_bindings();  // --numa-binding
  // What every worker of an attempt shares, and one worker's spec.
  struct Attempt {
    std::shared_ptr<FilteredLog> stdout_filtered;
    std::shared_ptr<FilteredLog> stderr_filtered;
    WorkerCommand command;
    std::vector<std::string> base;  // the agent's environment
    bool set_omp = false;
  };
  rdzv::Result<Attempt> prepare_attempt(int restart_count);
  rdzv::Result<WorkerSpec> worker_spec(const Attempt& attempt, const rdzv::RoundAssignment& round,
                                       int restart_count, int local_rank);
  rdzv::Status start_workers(const rdzv::RoundAssignment& round, int restart_count);
  // Python workers: asks their interpreter ($PYTHON_EXEC, python3) which torch it has
  // (kTorchVersionProbe), at setup, so that they get what that torch's agent gives; connect()
  // waits for the answer (bounded).
  void probe_workers_torch();
  Task<void> read_workers_torch(std::string python_exec);
  Task<void> torch_probed();
  rdzv::Status restart_worker(int local_rank, int restart_count);
  Task<void> stop_workers(int signo);
  // --duplicate-std{out,err}-filters: LOG_DIR/RUN_ID/attempt_N/filtered_<stream>.log, opened
  // (truncated) once per start and shared by every local rank; null when `filters` is empty.
  rdzv::Result<std::shared_ptr<FilteredLog>> open_filtered_log(
      int restart_count, const std::string& stream, const std::vector<std::string>& filters);
  // A log file a write to failed (told once by its sink): said with the cause, recorded as a
  // log_lost event with `fields`, and named again at the job's end.
  void report_lost_log(const std::string& whose, const std::string& path, int error,
                       rdzv::Json fields);
  // At the job's end: a line naming the log files that were cut short, if any.
  void say_lost_logs() const;
  // ---- hang reports (agent_hangs.cc) ----
  // This node's stacks (setup, once the Python helper's place is known), and from the first
  // connect on, the watch that answers the job's dump requests with them.
  std::unique_ptr<NodeStacks> make_node_stacks();
  void start_dump_watch();
  // The watchdog found a hung worker: the job's report, once for the ranks found together;
  // hang_report_pending_ until it is said (the watch's kill waits for it, bounded).
  void start_hang_report(const std::string& reason);
  Task<void> report_hang(std::string reason);
  // The failure report of every rank that failed in this attempt, told to the rendezvous.
  Task<void> report_failure(WorkerExit first);
  // What the failure report says of one failed worker (its stderr as read so far).
  FailureInfo failure_info(const WorkerExit& exit) const;
  // Each worker gets CTRUN_HEARTBEAT_FILE for the watchdog, and for faults planned at a step
  // and the fault report (the file holds the step the worker reported).
  bool heartbeat_files_on() const {
    return options_.worker_timeout > 0 || !options_.faults.empty() ||
           !options_.fault_report.empty() || options_.straggler_factor.value_or(0) > 0;
  }
  std::string attempt_root(int restart_count) const {
    return log_root_ + "/" + run_id_ + "/attempt_" + std::to_string(restart_count);
  }
  std::string attempt_dir(int restart_count, int local_rank) const {
    return attempt_root(restart_count) + "/" + std::to_string(local_rank);
  }
  // Where local rank `local_rank`'s running worker keeps its files.
  std::string worker_dir(int local_rank) const {
    const auto slot = static_cast<std::size_t>(local_rank);
    if (slot < worker_dirs_.size() && !worker_dirs_[slot].empty()) return worker_dirs_[slot];
    return attempt_dir(machine_->restart_count(), local_rank);
  }

  // ---- agent_watchdogs.cc: the file timer, the health port, stragglers, node health ----
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: the pipe made and served (its path goes to the workers).
  rdzv::Status start_file_timer();
  void file_timer_expired(const FileTimerReap& reap);
  // --worker_timeout's watchdog, made with the agent (it watches only with a timeout).
  std::unique_ptr<HungWorkerWatch> make_hung_worker_watch();
  // TORCHELASTIC_HEALTH_CHECK_PORT: up from the agent's start to its exit.
  rdzv::Status start_health_check();
  rdzv::HttpReply health_reply() const;
  // With heartbeat files, unless --straggler_factor=0: the workers' step rates watched.
  void start_straggler_watch();
  // The node's health checks, awaited before each join (setup: they need the log root).
  void start_node_health();

  // ---- faults ----
  // --faults or --fault_report: the runner of the plan (setup), with the agent's hooks.
  rdzv::Status start_fault_runner();

  // ---- the loop and the rendezvous ----
  asio::io_context& io_;
  LaunchOptions options_;
  int local_world_size_;
  AgentWorld world_;
  asio::steady_timer wake_;
  std::deque<AgentInput> inputs_;
  std::optional<AgentMachine> machine_;
  bool exiting_ = false;  // the machine said exit: spawned tasks still running start nothing
  int exit_signal_ = 0;   // the agent ends as this signal's default action would
  asio::signal_set signals_;
  asio::posix::stream_descriptor stdin_;
  std::array<char, 512> stdin_buf_{};
  asio::steady_timer barrier_;  // after success, the wait for the job's end
  asio::steady_timer waiting_line_timer_;
  std::string last_attempt_;  // why the backend's last connect attempt failed
  // What the machine was doing, and since when: the waiting lines' subject.
  AgentMachine::Phase phase_ = AgentMachine::Phase::kConnecting;
  bool reconnecting_ = false;
  std::chrono::steady_clock::time_point waiting_since_ = std::chrono::steady_clock::now();
  std::string run_id_;
  std::string node_id_;
  std::string host_;  // MASTER_ADDR when this node is group rank 0
  std::string endpoint_host_;
  std::uint16_t endpoint_port_ = 0;
  std::optional<std::string> token_;
  std::unique_ptr<rdzv::EventLog> event_log_;         // --event_log: this agent's events
  std::unique_ptr<rdzv::EventLog> server_event_log_;  // and its hosted rendezvous's
  std::unique_ptr<rdzv::Server> server_;              // when this agent hosts the rendezvous
  // It was to host the rendezvous, could not, and nobody may be answering there: the first
  // connect, when refused, hosts it after all.
  bool retry_hosting_ = false;
  std::unique_ptr<rdzv::Backend> client_;
  rdzv::RendezvousConfig config_;
  int requested_rank_ = -1;

  // ---- the workers ----
  std::unique_ptr<WorkerRunner> workers_;
  std::string log_root_;
  std::string temp_root_;  // removed at exit; empty when --log_dir was given
  // Holds ctrun_worker.py with heartbeat files (--worker_timeout, --faults, --fault_report) or
  // --fault_tolerance=step; else empty.
  std::string python_helper_dir_;
  std::string worker_proxy_;          // --fault_tolerance=step: this executable, for Python workers
  std::vector<CpuBinding> bindings_;  // --numa-binding: each local rank's, else empty
  // Adopted descendants that exited are reaped every second. Not on SIGCHLD: asio installs its
  // handlers without SA_RESTART, and every worker's exit would interrupt blocking calls.
  asio::steady_timer adopted_timer_;
  HeartbeatFiles heartbeat_files_;  // by local rank; none without heartbeat_files_on()
  std::unique_ptr<HungWorkerWatch> hung_workers_;
  std::vector<std::string> stderr_files_;  // by local rank; empty: no stderr.log
  // By local rank: the attempt directory its running worker was started in (with
  // --fault_tolerance=step a replaced worker's differs from its peers').
  std::vector<std::string> worker_dirs_;
  std::vector<std::string> stderr_places_;  // by local rank: where its stderr goes, in words
  std::vector<std::string> lost_logs_;      // log files a write to failed, in this run
  bool workers_run_python_ = false;         // the entrypoint runs under $PYTHON_EXEC
  bool torch_probe_pending_ = false;        // probe_workers_torch() has not answered yet
  std::optional<TorchVersion> workers_torch_;
  std::unique_ptr<FileTimerServer> file_timer_;      // TORCHELASTIC_ENABLE_FILE_TIMER=1
  std::unique_ptr<rdzv::HttpServer> health_server_;  // TORCHELASTIC_HEALTH_CHECK_PORT
  std::shared_ptr<StragglerWatch> stragglers_;       // null: not watched
  std::unique_ptr<NodeHealth> health_;               // before each join
  std::shared_ptr<DumpWatch> dumps_;                 // answers the job's dump requests
  std::unique_ptr<NodeStacks> stacks_;               // this node's answer to dump requests
  bool hang_report_pending_ = false;
  std::string hang_report_text_;  // the last report's section of the failure report

  // ---- the faults ----
  std::unique_ptr<FaultRunner> faults_;  // --faults, --fault_report
};

}  // namespace ctrun::launcher
