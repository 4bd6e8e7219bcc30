#include "agent.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string_view>

#include "adopted_children.h"
#include "agent_machine.h"
#include "agent_os.h"
#include "ctrun/launcher/failure_report.h"
#include "ctrun/launcher/worker_env.h"
#include "ctrun/rendezvous/endpoint.h"
#include "cut_off_backend.h"
#include "disk_fill.h"
#include "fault_injector.h"
#include "fault_report.h"
#include "fault_timeline.h"
#include "filtered_log.h"
#include "heartbeat_monitor.h"
#include "link_cut.h"
#include "native_stack_probe.h"
#include "python_helper.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/base/event_log.h"
#include "rendezvous/base/log.h"
#include "rendezvous/base/token.h"
#include "rendezvous/daemon/server.h"
#include "rendezvous/protocol/auth.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous_plan.h"
#include "worker_group.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;
using namespace asio::experimental::awaitable_operators;
using rdzv::Task;

namespace {

// A hung worker's last moments: eu-stack's time to take its native stacks, and a Python
// worker's time to write faulthandler's stacks and die of the SIGABRT.
constexpr std::chrono::milliseconds kNativeStacksTimeout{5000};
constexpr std::chrono::milliseconds kPythonStacksTimeout{2000};
// How long a failed worker's stderr may take to be read to its end for the report.
constexpr std::chrono::milliseconds kStderrDrainTimeout{2000};
// How often a waiting agent says what it waits for.
constexpr std::chrono::seconds kWaitingLineInterval{5};

// The backend's news as the agent's input.
AgentInput input_from_backend(const rdzv::BackendEvent& e) {
  switch (e.kind) {
    case rdzv::BackendEvent::Kind::kRoundReopened:
      return {.kind = AgentInput::Kind::kRoundReopened, .round = e.round, .reason = e.reason};
    case rdzv::BackendEvent::Kind::kJobEnded:
      return {.kind = AgentInput::Kind::kJobEnded, .state = e.state, .reason = e.reason};
    case rdzv::BackendEvent::Kind::kConnectionLost:
    case rdzv::BackendEvent::Kind::kConnectAttemptFailed:  // the agent's own, not the machine's
      break;
  }
  return {.kind = AgentInput::Kind::kConnectionLost, .reason = e.reason};
}

void log(const std::string& line) { rdzv::log_line("ctrun", line); }

rdzv::Duration seconds(double s) {
  return std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(s));
}

}  // namespace

class Agent::Impl {
 public:
  Impl(asio::io_context& io, LaunchOptions options, int local_world_size, AgentWorld world)
      : io_(io),
        options_(std::move(options)),
        local_world_size_(local_world_size),
        world_(std::move(world)),
        wake_(io),
        signals_(io),
        stdin_(io),
        fault_timer_(io),
        adopted_timer_(io),
        heartbeat_timer_(io),
        heartbeats_(std::chrono::duration_cast<std::chrono::milliseconds>(
            seconds(options_.worker_timeout))),
        workers_(world_.make_workers ? world_.make_workers(io) : std::make_unique<WorkerGroup>(io)),
        barrier_(io),
        waiting_line_timer_(io) {}

  int run() {
    if (auto s = open_event_logs(); !s) {
      log("error: " + s.error().message);
      return kAgentExitFailure;
    }
    if (!world_.adopt_orphans) {
      // (a test's in-memory workers have no descendants)
    } else if (auto s = become_child_subreaper(); !s) {
      log("warning: " + s.error().message +
          ": descendants of workers that outlive them go to init");
    } else {
      arm_adopted_reaping();
    }
    int code = kAgentExitFailure;
    asio::co_spawn(io_, main(), [&](std::exception_ptr e, int result) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          log("error: " + std::string(ex.what()));
        }
        result = kAgentExitFailure;
      }
      code = result;
      io_.stop();
    });
    io_.run();
    // Workers still there (a second stop signal exits at once), and what they left, go before
    // their logs' directory.
    workers_->kill_all();
    if (world_.adopt_orphans) kill_adopted_children(workers_->pids());
    finish_fault_report(code);
    event("agent_exit",
          {{"exit_code", code}, {"signal", exit_signal_ ? signal_name(exit_signal_) : ""}});
    cleanup();
    if (exit_signal_ != 0) {
      // No core file of the agent for a SIGQUIT: the ending is the point, not its memory.
      const rlimit no_core{0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      std::signal(exit_signal_, SIG_DFL);
      std::raise(exit_signal_);
    }
    return code;
  }

 private:
  // The job, then a goodbye to the rendezvous so that it lets this node go at once.
  Task<int> main();
  // Feeds the machine what happens and carries out what it decides, until it says exit.
  Task<int> run_job();
  // What needs no waiting: directories, token, bindings, the backend (and the rendezvous this
  // agent hosts). Then connect(): the backend reached and the job's budget set, as a task.
  rdzv::Status setup();
  Task<void> connect();
  // One action of the machine; the agent's exit code when it is kExit.
  Task<std::optional<int>> perform(AgentAction action);
  // The failure report of every rank that failed in this attempt, told to the rendezvous.
  Task<void> report_failure(WorkerExit first);
  // At the job's end: a line naming the log files that were cut short, if any.
  void say_lost_logs() const;
  // What the failure report says of one failed worker (its stderr as read so far).
  FailureInfo failure_info(const WorkerExit& exit) const;
  Task<void> stop_workers(int signo);
  Task<AgentInput> next_input();
  Task<void> linger(rdzv::Duration d);
  // After a lost connection: connect again (retrying up to join_timeout) and take this node's
  // place up again; where it finds the node is the machine's to judge.
  Task<void> reconnect();
  Task<void> await_failure_window();
  void begin_join();
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
  void arm_signals();
  // --stop_on_stdin_close: the end of standard input is a SIGTERM.
  void watch_stdin();
  // --faults: reads the plan (setup), and carries out what falls due while workers run.
  rdzv::Status load_fault_plan();
  // What a fault needs that this node may lack (root and nft for a lost link): an error naming
  // the fault, else ok.
  rdzv::Status check_fault_needs(const Fault& fault) const;
  void arm_fault_timer();
  void carry_out(const FaultInjector::Action& action, const FaultInjector::Due& due);
  // The node's faults (fault_injector.h): the link to a peer cut and restored, the disk filled
  // and freed, the hosted rendezvous stopped and started again.
  Task<void> cut_link(int fault_id, int peer);
  void restore_link(int fault_id);
  void fill_checkpoint_disk(int fault_id, const std::string& path);
  void free_checkpoint_disk(int fault_id);
  // At the agent's end: nothing of the node's faults outlives it.
  void end_node_faults();
  // What an injected fault was, in the job's store (kFaultsInjectedKey): `ctrun status`, the
  // daemon's metrics and `ctrun fault` read it there, apart from real failures. `then` runs
  // once it is written (or failed to be).
  void record_injected_fault(const FaultInjector::Fired& fired, int pid,
                             std::function<void()> then = nullptr);
  // `ctrun fault`: the faults asked for while the job runs, read from the job's store in turn
  // (with --faults only: nothing fires without a plan).
  Task<void> watch_fault_requests();
  void take_fault_request(std::int64_t number, const std::string& text);
  bool watching_fault_requests_ = false;
  // At the agent's end: each injected fault's line, and --fault_report's file.
  void finish_fault_report(int exit_code);
  // Each worker gets CTRUN_HEARTBEAT_FILE for the watchdog, and for faults planned at a step
  // and the fault report (the file holds the step the worker reported).
  bool heartbeat_files_on() const {
    return options_.worker_timeout > 0 || !options_.faults.empty() ||
           !options_.fault_report.empty();
  }
  void arm_adopted_reaping();
  // Every kWaitingLineInterval while the agent waits (to connect, for a round, to reconnect,
  // for the other nodes to finish): a line saying what for, how long, and why.
  void arm_waiting_line();
  void say_what_it_waits_for();
  void arm_heartbeat_check();
  void check_heartbeats();
  // A worker judged hung: its native stacks (eu-stack) into its log and the report; a Python
  // worker is then sent SIGABRT, on which faulthandler writes every thread's Python stack to
  // its stderr; then its process group is SIGKILLed.
  Task<void> kill_hung_worker(int local_rank, int pid);
  bool use_agent_store() const;  // TORCHELASTIC_USE_AGENT_STORE
  rdzv::Status plan_bindings();  // --numa-binding
  rdzv::Status host_rendezvous();
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
  rdzv::Status restart_worker(int local_rank, int restart_count);
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
  void cleanup() {
    if (!temp_root_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(temp_root_, ec);
    }
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
  std::string attempt_root(int restart_count) const {
    return log_root_ + "/" + run_id_ + "/attempt_" + std::to_string(restart_count);
  }
  // --duplicate-std{out,err}-filters: LOG_DIR/RUN_ID/attempt_N/filtered_<stream>.log, opened
  // (truncated) once per start and shared by every local rank; null when `filters` is empty.
  rdzv::Result<std::shared_ptr<FilteredLog>> open_filtered_log(
      int restart_count, const std::string& stream, const std::vector<std::string>& filters);
  // A log file a write to failed (told once by its sink): said with the cause, recorded as a
  // log_lost event with `fields`, and named again at the job's end.
  void report_lost_log(const std::string& whose, const std::string& path, int error,
                       rdzv::Json fields);

  asio::io_context& io_;
  LaunchOptions options_;
  int local_world_size_;
  AgentWorld world_;
  asio::steady_timer wake_;
  asio::signal_set signals_;
  asio::posix::stream_descriptor stdin_;
  std::array<char, 512> stdin_buf_{};
  std::optional<FaultInjector> faults_;  // --faults
  FaultReport fault_report_;             // what became of the faults injected here
  FaultTimeline fault_timeline_;         // the same as a picture (--fault_report=FILE.html)
  std::vector<std::optional<std::int64_t>> reported_steps_;  // by local rank, with --faults
  std::vector<std::string> result_files_;  // by local rank: CTRUN_RESULT_FILE (--fault_report)
  asio::steady_timer fault_timer_;
  CutOffBackend* cut_off_ = nullptr;      // client_, with --faults: the switch of a cut-off
  std::map<int, std::string> link_cuts_;  // by fault id: the nft table of a link cut now
  std::set<int> links_restored_early_;    // link faults that ended before their cut was made
  std::map<int, DiskFill> disk_fills_;    // by fault id: the file that fills a disk now
  // Adopted descendants that exited are reaped every second. Not on SIGCHLD: asio installs its
  // handlers without SA_RESTART, and every worker's exit would interrupt blocking calls.
  asio::steady_timer adopted_timer_;
  asio::steady_timer heartbeat_timer_;
  HeartbeatMonitor heartbeats_;
  std::vector<std::string> heartbeat_files_;  // by local rank; empty without --worker_timeout
  std::vector<std::string> stderr_files_;     // by local rank; empty: no stderr.log
  // By local rank: the attempt directory its running worker was started in (with
  // --fault_tolerance=step a replaced worker's differs from its peers').
  std::vector<std::string> worker_dirs_;
  std::vector<std::string> stderr_places_;  // by local rank: where its stderr goes, in words
  std::vector<std::string> lost_logs_;      // log files a write to failed, in this run
  bool workers_run_python_ = false;         // the entrypoint runs under $PYTHON_EXEC
  std::map<int, std::string> hung_stacks_;  // by pid, this group's workers killed as hung
  std::unique_ptr<WorkerRunner> workers_;
  std::deque<AgentInput> inputs_;
  std::optional<AgentMachine> machine_;
  bool exiting_ = false;
  int exit_signal_ = 0;  // the agent ends as this signal's default action would        // the
                         // machine said exit: spawned tasks still running start nothing
  asio::steady_timer barrier_;  // after success, the wait for the job's end
  asio::steady_timer waiting_line_timer_;
  std::string last_attempt_;  // why the backend's last connect attempt failed
  // What the machine was doing, and since when: the waiting lines' subject.
  AgentMachine::Phase phase_ = AgentMachine::Phase::kConnecting;
  bool reconnecting_ = false;
  std::chrono::steady_clock::time_point waiting_since_ = std::chrono::steady_clock::now();

  std::string run_id_;
  std::string log_root_;
  std::string temp_root_;  // removed at exit; empty when --log_dir was given
  // Holds ctrun_worker.py with heartbeat files (--worker_timeout, --faults, --fault_report);
  // else empty.
  std::string python_helper_dir_;
  std::string node_id_;
  std::string host_;  // MASTER_ADDR when this node is group rank 0
  std::string endpoint_host_;
  std::uint16_t endpoint_port_ = 0;
  std::optional<std::string> token_;
  std::unique_ptr<rdzv::EventLog> event_log_;         // --event_log: this agent's events
  std::unique_ptr<rdzv::EventLog> server_event_log_;  // and its hosted rendezvous's
  std::unique_ptr<rdzv::Server> server_;              // when this agent hosts the rendezvous
  bool rendezvous_down_ = false;  // the hosted rendezvous stopped by a fault, to start again
  // It was to host the rendezvous, could not, and nobody may be answering there: the first
  // connect, when refused, hosts it after all.
  bool retry_hosting_ = false;
  std::unique_ptr<rdzv::Backend> client_;
  std::vector<CpuBinding> bindings_;  // --numa-binding: each local rank's, else empty
  rdzv::RendezvousConfig config_;
  int requested_rank_ = -1;
};

Task<AgentInput> Agent::Impl::next_input() {
  while (inputs_.empty()) {
    wake_.expires_at(asio::steady_timer::time_point::max());
    co_await wake_.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  AgentInput input = std::move(inputs_.front());
  inputs_.pop_front();
  input.connected = client_ && client_->connected();
  co_return input;
}

Task<void> Agent::Impl::linger(rdzv::Duration d) {
  asio::steady_timer t(io_, d);
  co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
}

rdzv::Status Agent::Impl::setup() {
  const LaunchOptions& o = options_;
  run_id_ = o.standalone ? random_uuid() : o.rdzv_id;
  node_id_ = rdzv::local_host_name() + ":" + std::to_string(getpid()) + ":" + rdzv::random_hex(4);

  // Logs and error files live under --log_dir, or a private temporary directory.
  if (!o.log_dir.empty()) {
    log_root_ = o.log_dir;
  } else {
    // Under $TMPDIR when set, as torchrun's tempfile.mkdtemp.
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ctrun_XXXXXX";
    if (!mkdtemp(tmpl.data())) {
      return rdzv::Error{rdzv::ErrorCode::kInternal, "cannot create a temporary directory in " +
                                                         tmpl.substr(0, tmpl.rfind('/')) + ": " +
                                                         std::strerror(errno)};
    }
    log_root_ = temp_root_ = tmpl;
  }

  const char* env_token = std::getenv(rdzv::kTokenVariable);
  auto token = rdzv::resolve_token(
      o.rdzv_conf.token_file, env_token ? std::optional<std::string>(env_token) : std::nullopt);
  if (!token) return token.error();
  token_ = token.value();

  if (!o.numa_binding.empty()) {
    if (auto s = plan_bindings(); !s) return s;
  }
  if (!o.faults.empty()) {
    if (auto s = load_fault_plan(); !s) return s;
  } else if (!o.fault_report.empty()) {
    faults_.emplace(FaultPlan{});  // no faults: a clean run's report, to compare with
  }
  if (heartbeat_files_on()) {
    // Python workers report their steps and results (and raise a planned exception) through
    // ctrun's helper.
    const std::string dir = log_root_ + "/" + run_id_ + "/python";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = dir + "/" + kPythonHelperName;
    if (ec || !write_text_file_atomically(path, kPythonHelperSource)) {
      return rdzv::Error{rdzv::ErrorCode::kInternal,
                         "cannot write '" + path +
                             "': " + (ec ? ec.message() : std::string(std::strerror(errno)))};
    }
    python_helper_dir_ = dir;
  }

  config_.min_nodes = o.min_nodes;
  config_.max_nodes = o.max_nodes;
  config_.join_timeout = seconds(o.rdzv_conf.join_timeout);
  config_.last_call_timeout = seconds(o.rdzv_conf.last_call_timeout);
  config_.close_timeout = seconds(o.rdzv_conf.close_timeout);
  config_.keep_alive_interval = seconds(o.rdzv_conf.keep_alive_interval);
  config_.keep_alive_max_attempt = o.rdzv_conf.keep_alive_max_attempt;

  // Where the rendezvous is, and whether this agent hosts it.
  auto plan = plan_rendezvous(o, is_local_host);
  if (!plan) return plan.error();
  rdzv::BackendSpec& backend = plan.value().backend;
  // Read once here: a missing password file is one line before anything starts.
  if (auto s = rdzv::read_backend_secrets(backend); !s) return s;
  endpoint_host_ = backend.endpoints.front().host;
  endpoint_port_ = backend.endpoints.front().port;
  requested_rank_ = plan.value().requested_rank;
  if (plan.value().try_host) {
    auto hosted = host_rendezvous();
    if (hosted) {
      backend.endpoints.front().port = endpoint_port_;
    } else if (plan.value().must_host) {
      return hosted.error();
    } else {
      // Another agent on this machine hosts it: join as a client. Should nobody answer there
      // (the port was held by something else for a moment), the agent tries again to host it.
      retry_hosting_ = true;
    }
  }
  backend.job = run_id_;
  backend.token = token_;
  backend.connect_timeout = config_.join_timeout;
  backend.lease_ttl = config_.keep_alive_interval * config_.keep_alive_max_attempt;
  backend.log = [](const std::string& line) { rdzv::log_line("ctrun rendezvous", line); };
  backend.events = hosted_events();
  client_ = world_.make_backend ? world_.make_backend(io_, std::move(backend))
                                : rdzv::make_backend(io_, std::move(backend));
  if (faults_) {
    // A planned (or asked for) cut-off is this switch's.
    auto switched = std::make_unique<CutOffBackend>(io_, std::move(client_));
    cut_off_ = switched.get();
    client_ = std::move(switched);
  }
  client_->set_event_handler([this](const rdzv::BackendEvent& e) {
    if (e.kind == rdzv::BackendEvent::Kind::kConnectAttemptFailed) {
      last_attempt_ = e.reason;  // for the waiting lines
      // Nobody listens where this machine's rendezvous should be: host it after all (the
      // agent that was to host it may have gone, or its port was only held for a moment).
      if (retry_hosting_ && !server_ && e.reason.find("refused") != std::string::npos &&
          host_rendezvous()) {
        retry_hosting_ = false;
      }
    } else {
      post(input_from_backend(e));
    }
  });
  return rdzv::ok_status();
}

// The rendezvous this agent hosts, on endpoint_host_:endpoint_port_ (0: any free port).
rdzv::Status Agent::Impl::host_rendezvous() {
  rdzv::ServerOptions server_options;
  server_options.host = endpoint_host_;
  server_options.port = endpoint_port_;
  server_options.service.token = token_;
  server_options.service.log = [](const std::string& line) {
    rdzv::log_line("ctrun rendezvous", line);
  };
  server_options.service.events = hosted_events();
  // Workers reach the job's store here as torch's TCPStore (TORCHELASTIC_USE_AGENT_STORE).
  server_options.service.worker_store_job = run_id_;
  if (faults_) {
    // A rendezvous restart (a fault) brings it back as ctrund with --state_dir comes back: with
    // the job's rounds and store.
    server_options.state_dir = log_root_ + "/" + run_id_ + "/rendezvous";
  }
  auto server = rdzv::Server::create(io_, server_options);
  if (!server) return server.error();
  server_ = std::move(server).value();
  server_->start();
  endpoint_port_ = server_->port();
  log("hosting the rendezvous on " + server_->endpoint());
  return rdzv::ok_status();
}

Task<void> Agent::Impl::connect() {
  const LaunchOptions& o = options_;
  AgentInput connected{.kind = AgentInput::Kind::kConnected};
  connected.status = co_await client_->connect();
  retry_hosting_ = false;  // only the first connect hosts a rendezvous nobody answers for
  if (exiting_) co_return;
  if (connected.status) {
    client_->start_keep_alive(config_.keep_alive_interval, config_.keep_alive_max_attempt);
    host_ = !o.local_addr.empty() ? o.local_addr : client_->local_address();
    announce_start();
    // For `ctrun status`: the budget beside the count of restarts used.
    const std::string budget = std::to_string(o.max_restarts);
    connected.status = co_await client_->set(rdzv::kMaxRestartsKey, budget);
  }
  if (connected.status && !o.faults.empty() && !watching_fault_requests_) {
    watching_fault_requests_ = true;
    spawn([this]() -> Task<void> { co_await watch_fault_requests(); });
  }
  if (connected.status) {
    if (!o.rdzv_conf.ignored_keys.empty()) {
      std::string keys;
      for (const auto& k : o.rdzv_conf.ignored_keys) keys += (keys.empty() ? "" : ", ") + k;
      log("--rdzv_conf keys not used by ctrun, ignored: " + keys);
    }
    if (local_world_size_ > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
      log("Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to "
          "avoid your system being overloaded, please further tune the variable for optimal "
          "performance in your application as needed.");
    }
  }
  post(std::move(connected));
}

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

// As torchrun: workers are clients of the agent's store with the static backend, and with the
// others unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. Where the rendezvous does not serve it (a
// ctrund without --worker_store_ports, etcd), rank 0's worker hosts torch's TCPStore at the
// round's master (docs/env.md).
bool Agent::Impl::use_agent_store() const {
  const char* no_sharing = std::getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE");
  const bool is_static = !options_.standalone && options_.rdzv_backend == "static";
  const bool sharing = is_static || !no_sharing || std::string_view(no_sharing) != "1";
  return sharing && client_->worker_store_port().has_value();
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
  const char* python = std::getenv("PYTHON_EXEC");
  const std::string python_exec = python && *python ? python : "python3";
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
  in.replica_id = node_id_ + "/" + std::to_string(local_rank);
  if (!o.fault_report.empty()) {
    in.result_file = dir + "/result";
    std::remove(in.result_file.c_str());  // a result is this worker's, never an earlier one's
    result_files_.resize(static_cast<std::size_t>(local_world_size_));
    result_files_.at(slot) = in.result_file;
  }
  if (faults_) {
    in.fault_file = dir + "/fault";
    std::remove(in.fault_file.c_str());  // a planned exception is for the process it was sent to
  }
  in.python_helper_dir = python_helper_dir_;
  if (heartbeat_files_on()) {
    in.heartbeat_file = dir + "/heartbeat";
    if (std::FILE* f = std::fopen(in.heartbeat_file.c_str(), "w")) std::fclose(f);
    heartbeat_files_.at(slot) = in.heartbeat_file;
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
  heartbeat_files_.assign(heartbeat_files_on() ? n : 0, "");
  stderr_files_.assign(n, "");
  stderr_places_.assign(n, "");
  worker_dirs_.assign(n, "");
  hung_stacks_.clear();
  std::vector<WorkerSpec> specs;
  for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
    auto spec = worker_spec(attempt.value(), round, restart_count, local_rank);
    if (!spec) return spec.error();
    specs.push_back(std::move(spec).value());
  }
  std::vector<std::int64_t> initial_stamps;
  for (const auto& file : heartbeat_files_) initial_stamps.push_back(modification_stamp(file));
  heartbeats_.reset(initial_stamps, std::chrono::steady_clock::now());
  workers_->set_log_error_handler([this, offset = round.rank_offset](
                                      int local_rank, const std::string& path, int error) {
    const int rank = offset + local_rank;
    report_lost_log(
        "worker rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + ")",
        path, error, {{"rank", rank}, {"local_rank", local_rank}});
  });
  auto started = workers_->start(std::move(specs), [this](const WorkerExit& e) {
    if (faults_ && (e.exit_code != 0 || e.signal != 0)) {
      fault_report_.worker_failed(e.local_rank, std::chrono::system_clock::now());
    }
    if (faults_) {
      fault_timeline_.worker_ended(e.local_rank, e.exit_code == 0 && e.signal == 0,
                                   std::chrono::system_clock::now());
    }
    post({.kind = AgentInput::Kind::kWorkerExit, .exit = e});
  });
  if (started) {
    event("workers_started",
          {{"round", round.round}, {"restart", restart_count}, {"pids", workers_->pids()}});
    if (faults_) {
      faults_->set_hosts_rendezvous(server_ != nullptr || rendezvous_down_);
      faults_->workers_started(round.group_rank, round.rank_offset, local_world_size_,
                               std::chrono::steady_clock::now());
      // Where this node is, for a peer's lost link (the cutting agent looks its peer up).
      spawn([this, key = round.store_prefix + rdzv::kFaultHostKey +
                         std::to_string(round.group_rank)]() -> Task<void> {
        (void)co_await client_->set(key, host_);
      });
      fault_report_.workers_started(std::nullopt, std::chrono::system_clock::now());
      fault_report_.restarts(restart_count);
      fault_timeline_.workers_started(std::nullopt, round.rank_offset, local_world_size_,
                                      std::chrono::system_clock::now());
      reported_steps_.assign(static_cast<std::size_t>(local_world_size_), std::nullopt);
      fault_timer_.cancel();
      arm_fault_timer();
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
  if (heartbeat_files_on()) {
    const auto& file = heartbeat_files_.at(static_cast<std::size_t>(local_rank));
    heartbeats_.replace(local_rank, modification_stamp(file), std::chrono::steady_clock::now());
  }
  auto started = workers_->restart(std::move(spec).value());
  if (started && faults_) {
    faults_->worker_replaced(local_rank);
    fault_report_.workers_started(local_rank, std::chrono::system_clock::now());
    fault_report_.restarts(restart_count);
    fault_timeline_.workers_started(local_rank, round.rank_offset, local_world_size_,
                                    std::chrono::system_clock::now());
    if (static_cast<std::size_t>(local_rank) < reported_steps_.size()) {
      reported_steps_[local_rank] = std::nullopt;
    }
  }
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
  workers_->stop(
      signo,
      std::chrono::duration_cast<std::chrono::milliseconds>(seconds(options_.shutdown_timeout)),
      [&] {
        stopped = true;
        done.cancel();
      });
  if (faults_) {
    // A worker a planned hang holds stopped sees the signal once continued, as a real hung
    // worker would.
    for (int local_rank : faults_->stopped_workers()) workers_->kill(local_rank, SIGCONT);
    faults_->workers_stopped();
    fault_report_.workers_stopped(std::chrono::system_clock::now());
    fault_timeline_.workers_stopped(std::chrono::system_clock::now());
  }
  while (!stopped) co_await done.async_wait(asio::as_tuple(asio::use_awaitable));
  // What the workers left that escaped their process groups (a setsid daemon) goes too.
  if (world_.adopt_orphans) kill_adopted_children(workers_->pids());
}

Task<int> Agent::Impl::main() {
  const int code = co_await run_job();
  if (client_) co_await client_->release();
  co_return code;
}

Task<int> Agent::Impl::run_job() {
  for (int signo : options_.signals_to_handle) {
    boost::system::error_code ec;
    signals_.add(signo, ec);
  }
  arm_signals();
  if (options_.stop_on_stdin_close) watch_stdin();
  if (options_.worker_timeout > 0) arm_heartbeat_check();

  if (auto s = setup(); !s) {
    log("error: " + s.error().message);
    co_return kAgentExitFailure;
  }
  machine_.emplace(
      AgentMachineConfig{.local_world_size = local_world_size_,
                         .max_restarts = options_.max_restarts,
                         .endpoint = rdzv::format_endpoint({endpoint_host_, endpoint_port_}),
                         .join_timeout_s = rdzv::to_millis(config_.join_timeout) / 1000,
                         .replace_failed_workers = options_.fault_tolerance == "step"});
  std::vector<AgentAction> actions = machine_->start();
  arm_waiting_line();
  while (true) {
    for (AgentAction& action : actions) {
      if (auto code = co_await perform(std::move(action))) co_return *code;
    }
    AgentInput input = co_await next_input();
    actions = machine_->handle(input);
    if (machine_->phase() != phase_ || machine_->reconnecting() != reconnecting_) {
      phase_ = machine_->phase();
      reconnecting_ = machine_->reconnecting();
      waiting_since_ = std::chrono::steady_clock::now();
      last_attempt_.clear();
      arm_waiting_line();  // the first line comes kWaitingLineInterval into each wait
    }
  }
}

Task<std::optional<int>> Agent::Impl::perform(AgentAction a) {
  using K = AgentAction::Kind;
  switch (a.kind) {
    case K::kLog:
      log(a.text);
      break;
    case K::kRecord:
      event(a.name, std::move(a.fields));
      break;
    case K::kConnect:
      spawn(connect());
      break;
    case K::kJoin:
      begin_join();
      break;
    case K::kStartWorkers: {
      AgentInput started{.kind = AgentInput::Kind::kWorkersStarted};
      started.status = start_workers(a.round, a.restart_count);
      post(std::move(started));
      break;
    }
    case K::kRestartWorker:
      if (auto s = restart_worker(a.exit.local_rank, a.restart_count); !s) {
        // It never ran: as good as a failed start of that rank, which the machine counts again.
        log("error: " + s.error().message);
        WorkerExit failed = a.exit;
        failed.pid = 0;
        failed.signal = 0;
        failed.exit_code = 127;
        failed.at = std::chrono::system_clock::now();
        post({.kind = AgentInput::Kind::kWorkerExit, .exit = failed});
      }
      break;
    case K::kForwardSignal:
      for (int r = 0; r < local_world_size_; ++r) workers_->kill(r, a.signo);
      break;
    case K::kAwaitFailureWindow:
      spawn(await_failure_window());
      break;
    case K::kStopWorkers:
      spawn([this, signo = a.signo]() -> Task<void> {
        co_await stop_workers(signo);
        post({.kind = AgentInput::Kind::kWorkersStopped});
      });
      break;
    case K::kCountRestart:
      // The restart budget is the job's, not the node's: one counter in the job's store.
      spawn([this]() -> Task<void> {
        AgentInput counted{.kind = AgentInput::Kind::kRestartCounted};
        counted.count = co_await client_->add(rdzv::kRestartsKey, 1);
        post(std::move(counted));
      });
      break;
    case K::kReconnect:
      spawn(reconnect());
      break;
    case K::kReportResult:
      if (a.ok) say_lost_logs();
      spawn([this, ok = a.ok, text = std::move(a.text)]() -> Task<void> {
        (void)co_await client_->report(ok, text);
        // A failure: let the job's end reach the other nodes before this one goes.
        if (!ok) co_await linger(std::chrono::milliseconds(200));
        post({.kind = AgentInput::Kind::kRendezvousTold});
      });
      break;
    case K::kFailureReport:
      spawn(report_failure(a.exit));
      break;
    case K::kAwaitBarrier:
      // Wait for the job's end (every node done) so that a hosted rendezvous outlives its
      // users; bounded like torchrun's exit barrier.
      barrier_.expires_after(std::chrono::seconds(300));
      barrier_.async_wait([this](boost::system::error_code ec) {
        if (!ec) post({.kind = AgentInput::Kind::kBarrierExpired});
      });
      break;
    case K::kLeave:
      spawn([this]() -> Task<void> {
        (void)co_await client_->leave();
        post({.kind = AgentInput::Kind::kRendezvousTold});
      });
      break;
    case K::kExit:
      exiting_ = true;
      exit_signal_ = a.signo;
      co_return a.code;
  }
  co_return std::nullopt;
}

Task<void> Agent::Impl::await_failure_window() {
  const auto window = std::chrono::steady_clock::now() + seconds(options_.monitor_interval);
  while (workers_->running() > 0 && std::chrono::steady_clock::now() < window) {
    co_await linger(std::chrono::milliseconds(5));
  }
  post({.kind = AgentInput::Kind::kFailureWindowOver});
}

Task<void> Agent::Impl::reconnect() {
  AgentInput reconnected{.kind = AgentInput::Kind::kReconnected};
  reconnected.status = co_await client_->connect();
  if (!reconnected.status) {
    post(std::move(reconnected));
    co_return;
  }
  client_->start_keep_alive(config_.keep_alive_interval, config_.keep_alive_max_attempt);
  auto resumed = co_await client_->resume(node_id_);
  if (resumed) {
    reconnected.place.round = resumed.value().value("round", 0);
    reconnected.place.state = resumed.value().value("state", "running");
  } else if (resumed.error().code == rdzv::ErrorCode::kNotFound) {
    reconnected.place.known = false;
    reconnected.place.why = resumed.error().message;
  } else {
    reconnected.status = resumed.error();
  }
  post(std::move(reconnected));
}

void Agent::Impl::begin_join() {
  // Exits of the group just stopped must not be read as news about the next one.
  std::erase_if(inputs_,
                [](const AgentInput& in) { return in.kind == AgentInput::Kind::kWorkerExit; });
  rdzv::NodeInfo node{node_id_, host_, local_world_size_, free_port(io_, host_), requested_rank_};
  event("join", {{"node_host", host_}, {"local_world_size", local_world_size_}});
  // The answer arrives as an input, so nothing (a signal, an old event) cancels a join that
  // the daemon has already taken.
  spawn([this, node]() -> Task<void> {
    auto result = co_await client_->join(node, config_);
    if (result) {
      // Again for each round: a join that started a new job under an ended one's id took the
      // old job's store, and the budget set at start with it.
      const std::string budget = std::to_string(options_.max_restarts);
      (void)co_await client_->set(rdzv::kMaxRestartsKey, budget);
      rdzv::RoundAssignment& round = result.value();
      if (use_agent_store()) {  // workers meet in the job's store, on the daemon's host
        round.master_addr = endpoint_host_;
        round.master_port = *client_->worker_store_port();
      }
      if (round.restart_count < 0) {
        // A daemon from before restart counts in answers: read now (may run ahead).
        auto restarts = co_await client_->get(rdzv::kRestartsKey, std::chrono::milliseconds(0));
        round.restart_count =
            restarts ? static_cast<int>(rdzv::counter_value(restarts.value(), 0)) : 0;
      }
    }
    post({.kind = AgentInput::Kind::kJoined, .joined = std::move(result)});
  });
}

void Agent::Impl::arm_adopted_reaping() {
  adopted_timer_.expires_after(std::chrono::seconds(1));
  adopted_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    reap_adopted_children(workers_->pids());
    arm_adopted_reaping();
  });
}

void Agent::Impl::arm_signals() {
  signals_.async_wait([this](boost::system::error_code ec, int signo) {
    if (ec) return;
    post({.kind = AgentInput::Kind::kSignal, .signo = signo});
    arm_signals();
  });
}

void Agent::Impl::watch_stdin() {
  if (!stdin_.is_open()) {
    const int fd = ::fcntl(0, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) {  // no standard input at all: it has ended
      post({.kind = AgentInput::Kind::kSignal, .signo = SIGTERM});
      return;
    }
    stdin_.assign(fd);
  }
  stdin_.async_read_some(
      asio::buffer(stdin_buf_), [this](boost::system::error_code ec, std::size_t) {
        if (ec == asio::error::operation_aborted) return;
        if (ec) {  // the end (or a broken input: the same to a launcher that is gone)
          log("standard input closed (--stop_on_stdin_close): stopping");
          post({.kind = AgentInput::Kind::kSignal, .signo = SIGTERM});
          return;
        }
        watch_stdin();  // what is written there means nothing; only its end does
      });
}

rdzv::Status Agent::Impl::load_fault_plan() {
  const std::string& value = options_.faults;
  rdzv::Result<FaultPlan> plan = FaultPlan{};
  if (value == "live") {
    // No planned faults: only those `ctrun fault` asks for while the job runs.
  } else if (auto text = read_text_file(value)) {
    plan = parse_fault_plan_json(*text, value);
  } else if (value.rfind("random:", 0) == 0) {
    plan = random_fault_plan(value);
  } else {
    plan = parse_inline_fault_plan(value);
  }
  if (!plan) return plan.error();
  for (const Fault& f : plan.value().faults) {
    if (auto s = check_fault_needs(f); !s) return s;
  }
  // The plan as it will run, windows drawn: what --faults reads back to replay it exactly.
  const rdzv::Json json = fault_plan_json(plan.value());
  log("fault plan (replay it with --faults=FILE holding this line): " + json.dump());
  event("fault_plan", {{"plan", json}});
  faults_.emplace(std::move(plan).value());
  return rdzv::ok_status();
}

rdzv::Status Agent::Impl::check_fault_needs(const Fault& f) const {
  const std::string where = "--faults: fault " + std::to_string(f.id) + ": ";
  if (f.kind == FaultKind::kLinkLost) {
    if (!can_admin_network()) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         where +
                             "a lost link is cut with nftables rules, which need root "
                             "(CAP_NET_ADMIN) on every node; run the job's agents as root, "
                             "e.g. in network namespaces (scripts/netns-cluster.sh)"};
    }
    if (run_tool({"nft", "--version"}).exit_code != 0) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         where +
                             "a lost link is cut with nft, which is not installed here "
                             "(Debian: apt-get install nftables)"};
    }
  }
  if (f.kind == FaultKind::kCudaError && probe_machine(process_env()).gpu_count == 0) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       where +
                           "a CUDA error is made by a failing kernel on the worker's GPU, and "
                           "this node has none visible (no /dev/nvidiaN, or "
                           "CUDA_VISIBLE_DEVICES hides them)"};
  }
  if (f.kind == FaultKind::kRendezvousRestart &&
      (options_.rdzv_backend == "etcd" || options_.rdzv_backend == "etcd-v2" ||
       options_.rdzv_conf.is_host == false)) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       where +
                           "a rendezvous restart restarts the rendezvous ctrun hosts "
                           "(--standalone, --hostfile, or c10d hosted by an agent); this job's "
                           "is a service of its own (etcd, or ctrund with is_host=false): "
                           "restart that yourself"};
  }
  return rdzv::ok_status();
}

void Agent::Impl::arm_fault_timer() {
  if (!faults_) return;
  // Also once every fault has fired: the report follows the steps after them.
  fault_timer_.expires_after(std::chrono::milliseconds(20));
  fault_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || exiting_) return;
    const auto wall = std::chrono::system_clock::now();
    reported_steps_.resize(heartbeat_files_.size());
    for (std::size_t i = 0; i < heartbeat_files_.size(); ++i) {
      auto step = reported_step(heartbeat_files_[i]);
      if (!step || step == reported_steps_[i]) continue;
      reported_steps_[i] = step;
      faults_->observe_step(static_cast<int>(i), *step);
      fault_report_.step_reported(static_cast<int>(i), *step, wall);
      fault_timeline_.step(static_cast<int>(i), *step, wall);
    }
    auto due = faults_->poll(std::chrono::steady_clock::now());
    // A cut-off drops the rendezvous' connections: its fault is recorded there first.
    auto recorded_first = [&due](const FaultInjector::Action& a) {
      return a.kind == FaultInjector::Action::Kind::kCutOff &&
             std::any_of(due.fired.begin(), due.fired.end(),
                         [&a](const auto& f) { return f.fault_id == a.fault_id; });
    };
    for (const auto& fired : due.fired) {
      fault_report_.fired(fired.fault_id, fired.line, fired.rank, fired.local_rank,
                          fired.ends_worker,
                          static_cast<std::size_t>(fired.local_rank) < reported_steps_.size()
                              ? reported_steps_[fired.local_rank]
                              : std::nullopt,
                          wall);
      log("injecting " + fired.line);
      const int pid = workers_->running_pid(fired.local_rank);
      event("fault_injected", {{"injected", true},
                               {"fault", fired.fault_id},
                               {"rank", fired.rank},
                               {"local_rank", fired.local_rank},
                               {"pid", pid},
                               {"what", fired.line}});
      std::vector<FaultInjector::Action> after;
      for (const auto& a : due.actions) {
        if (recorded_first(a) && a.fault_id == fired.fault_id) after.push_back(a);
      }
      record_injected_fault(fired, pid, [this, after, due] {
        for (const auto& a : after) carry_out(a, due);
      });
      fault_timeline_.fired(fired.fault_id, fired.local_rank, fired.line,
                            fired.kind == FaultKind::kHang        ? FaultTimeline::State::kHung
                            : fired.kind == FaultKind::kStraggler ? FaultTimeline::State::kSlowed
                                                                  : FaultTimeline::State::kRunning,
                            wall);
    }
    for (const auto& a : due.actions) {
      if (a.ends_effect) fault_timeline_.effect_ended(a.local_rank, wall);
      if (!recorded_first(a)) carry_out(a, due);
    }
    arm_fault_timer();
  });
}

void Agent::Impl::carry_out(const FaultInjector::Action& a, const FaultInjector::Due& due) {
  using Kind = FaultInjector::Action::Kind;
  const std::string id = "fault " + std::to_string(a.fault_id);
  switch (a.kind) {
    case Kind::kSignal:
      workers_->signal_process(a.local_rank, a.signo);  // as a crash of the worker itself
      return;
    case Kind::kStop:
    case Kind::kContinue:
      workers_->kill(a.local_rank, a.signo);  // SIGSTOP/SIGCONT: the whole process group
      return;
    case Kind::kNodeLost:
      // As a machine that dies: no goodbye to the rendezvous, no report, workers and agent
      // gone at once (the log and event lines are written already).
      workers_->kill_all();
      std::raise(SIGKILL);
      return;
    case Kind::kRaise: {
      // Raised, or the failing kernel launched, by the worker itself at its next reported step
      // (ctrun_worker.report_step): the file's first line is the kind, the second the message.
      const std::string file = worker_dir(a.local_rank) + "/fault";
      std::string what = id;
      const char* kind = "exception";
      for (const auto& fired : due.fired) {
        if (fired.fault_id != a.fault_id) continue;
        what = fired.line;
        if (fired.kind == FaultKind::kCudaError) kind = "cuda_error";
      }
      if (!write_text_file_atomically(file,
                                      std::string(kind) + "\nctrun: injected " + what + "\n")) {
        log("error: " + id + ": cannot write '" + file + "': " + std::strerror(errno));
      }
      return;
    }
    case Kind::kStoreLatency: {
      // The daemon reads the key as it is set (service.cc) and delays the job's answers.
      const std::string text = rdzv::Json{{"ms", a.ms}, {"seconds", a.seconds}}.dump();
      spawn([this, text, id]() -> Task<void> {
        auto s = co_await client_->set(rdzv::kStoreLatencyKey, text);
        if (!s) log("error: " + id + ": the rendezvous was not told: " + s.error().message);
      });
      return;
    }
    case Kind::kCutOff:
      if (cut_off_) {
        cut_off_->cut_off(
            std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(a.seconds)),
            "cut off from the rendezvous by " + id);
      }
      return;
    case Kind::kLinkDown:
      spawn(cut_link(a.fault_id, a.peer));
      return;
    case Kind::kLinkUp:
      restore_link(a.fault_id);
      return;
    case Kind::kFillDisk:
      fill_checkpoint_disk(a.fault_id, a.path);
      return;
    case Kind::kFreeDisk:
      free_checkpoint_disk(a.fault_id);
      return;
    case Kind::kStopRendezvous:
      if (server_) {
        // As a daemon killed: every connection closed at once, no goodbye; what it keeps of
        // the job is in its state files.
        server_->stop();
        server_.reset();
        rendezvous_down_ = true;
        log(id + ": the rendezvous this agent hosts is down");
      }
      return;
    case Kind::kStartRendezvous:
      if (rendezvous_down_ && !exiting_) {
        rendezvous_down_ = false;
        if (auto s = host_rendezvous(); !s) {
          log("error: " + id + ": the rendezvous could not start again: " + s.error().message);
        }
      }
      return;
  }
}

Task<void> Agent::Impl::cut_link(int fault_id, int peer) {
  const std::string id = "fault " + std::to_string(fault_id);
  const rdzv::RoundAssignment round = machine_->round();
  // The peer says where it is as its workers start; a moment's wait covers a peer just starting.
  auto host = co_await client_->get(round.store_prefix + rdzv::kFaultHostKey + std::to_string(peer),
                                    std::chrono::seconds(10));
  if (!host) {
    log("error: " + id + ": node " + std::to_string(peer) +
        "'s address is not known (it publishes it as its workers start): " + host.error().message);
    co_return;
  }
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(host.value(), ec);
  if (ec) {
    asio::ip::tcp::resolver resolver(io_);
    auto found = resolver.resolve(host.value(), "", ec);
    if (!ec && !found.empty()) address = found.begin()->endpoint().address();
  }
  if (ec) {
    log("error: " + id + ": node " + std::to_string(peer) + "'s address '" + host.value() +
        "' cannot be resolved: " + ec.message());
    co_return;
  }
  const std::string table = link_cut_table(static_cast<int>(::getpid()), fault_id);
  const ToolRun run = run_tool(link_cut_command(table, address.to_string(), address.is_v6()));
  if (run.exit_code != 0) {
    log("error: " + id + ": nft could not cut the link: " + run.output);
    co_return;
  }
  link_cuts_[fault_id] = table;
  log(id + ": the link to node " + std::to_string(peer) + " (" + address.to_string() +
      ") is cut (nft table inet " + table + ")");
  if (links_restored_early_.erase(fault_id) > 0) restore_link(fault_id);
}

void Agent::Impl::restore_link(int fault_id) {
  auto cut = link_cuts_.find(fault_id);
  if (cut == link_cuts_.end()) {
    links_restored_early_.insert(fault_id);  // its cut is still on the way
    return;
  }
  const ToolRun run = run_tool(link_restore_command(cut->second));
  if (run.exit_code != 0) {
    log("error: fault " + std::to_string(fault_id) + ": nft could not remove table inet " +
        cut->second + ": " + run.output + " (remove it by hand: nft delete table inet " +
        cut->second + ")");
  } else {
    log("fault " + std::to_string(fault_id) + ": the link is back");
  }
  link_cuts_.erase(cut);
}

void Agent::Impl::fill_checkpoint_disk(int fault_id, const std::string& path) {
  const std::string id = "fault " + std::to_string(fault_id);
  auto fill = fill_disk(path, fault_id);
  if (!fill) {
    log("error: " + id + ": cannot fill the disk: " + fill.error().message);
    return;
  }
  log(id + ": the disk of '" + path + "' is full (" + std::to_string(fill.value().bytes >> 20) +
      " MiB in " + fill.value().file + ")");
  disk_fills_[fault_id] = std::move(fill).value();
}

void Agent::Impl::free_checkpoint_disk(int fault_id) {
  auto fill = disk_fills_.find(fault_id);
  if (fill == disk_fills_.end()) return;
  if (auto s = free_disk(fill->second); !s) {
    log("error: fault " + std::to_string(fault_id) + ": " + s.error().message);
  } else {
    log("fault " + std::to_string(fault_id) + ": the disk has room again");
  }
  disk_fills_.erase(fill);
}

void Agent::Impl::end_node_faults() {
  if (!faults_) return;
  for (const auto& a : faults_->end_node_faults()) {
    if (a.kind == FaultInjector::Action::Kind::kLinkUp) restore_link(a.fault_id);
    if (a.kind == FaultInjector::Action::Kind::kFreeDisk) free_checkpoint_disk(a.fault_id);
  }
}

void Agent::Impl::record_injected_fault(const FaultInjector::Fired& fired, int pid,
                                        std::function<void()> then) {
  rdzv::Json record{{"time", rdzv::utc_stamp(std::chrono::system_clock::now())},
                    {"node", node_id_},
                    {"host", host_},
                    {"fault", fired.fault_id},
                    {"rank", fired.rank},
                    {"local_rank", fired.local_rank},
                    {"pid", pid},
                    {"what", fired.line},
                    {"injected", true}};
  std::optional<std::int64_t> request;
  if (fired.fault_id > faults_->planned()) {
    request = fired.fault_id - faults_->planned();
    record["request"] = *request;
  }
  spawn([this, text = record.dump(), request, id = fired.fault_id,
         then = std::move(then)]() -> Task<void> {
    auto number = co_await client_->add(rdzv::kFaultsInjectedKey, 1);
    // (No co_await inside a conditional expression: g++ 12 destroys the other branch's
    // temporary twice.)
    rdzv::Status s = rdzv::ok_status();
    if (number) {
      s = co_await client_->set(rdzv::kFaultInjectedPrefix + std::to_string(number.value()), text);
    } else {
      s = number.error();
    }
    if (s && request) {
      s = co_await client_->set(
          rdzv::kFaultRequestPrefix + std::to_string(*request) + rdzv::kFaultRequestDoneSuffix,
          text);
    }
    if (!s) {
      log("warning: fault " + std::to_string(id) +
          ": not recorded in the job's store (ctrun status): " + s.error().message);
    }
    if (then) then();
  });
}

Task<void> Agent::Impl::watch_fault_requests() {
  // Only faults asked for from now on: an agent that joins later does not replay old ones.
  std::int64_t next = 0;
  while (!exiting_) {
    if (next == 0) {
      auto count = co_await client_->add(rdzv::kFaultRequestsKey, 0);
      if (count) {
        next = count.value() + 1;
        continue;
      }
    } else {
      // Bounded waits, so that a reconnect or the end of the job is noticed.
      const std::string key = rdzv::kFaultRequestPrefix + std::to_string(next);
      auto text = co_await client_->get(key, std::chrono::seconds(10));
      if (text) {
        take_fault_request(next++, text.value());
        continue;
      }
      if (text.error().code == rdzv::ErrorCode::kTimeout) continue;
    }
    if (exiting_) co_return;
    co_await linger(std::chrono::seconds(1));  // not connected now (a reconnect in progress)
  }
}

void Agent::Impl::take_fault_request(std::int64_t number, const std::string& text) {
  const std::string name = "ctrun fault " + std::to_string(number);
  rdzv::Json fault = rdzv::Json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto plan =
      fault.is_object()
          ? parse_fault_plan_json(rdzv::Json{{"faults", rdzv::Json::array({fault})}}.dump(), name)
          : rdzv::Result<FaultPlan>(rdzv::Error{rdzv::ErrorCode::kBadRequest, "not a JSON object"});
  if (!plan || plan.value().faults.size() != 1) {
    log("warning: " + name +
        " ignored: " + (plan ? std::string("not one fault") : plan.error().message));
    return;
  }
  Fault f = plan.value().faults.front();
  f.id = faults_->planned() + static_cast<int>(number);
  if (auto s = check_fault_needs(f); !s) {
    log("warning: " + name + " ignored: " + s.error().message);
    return;
  }
  // A time in it counts from now (ctrun fault's default: at once).
  log("fault asked for (" + name + "): " + describe_fault(f) + (f.at_step ? "" : " from now"));
  event("fault_requested", {{"fault", f.id}, {"request", number}, {"what", describe_fault(f)}});
  faults_->add(std::move(f), std::chrono::steady_clock::now());
}

void Agent::Impl::finish_fault_report(int exit_code) {
  if (!faults_) return;
  end_node_faults();
  for (const auto& line : fault_report_.lines()) log(line);
  if (options_.fault_report.empty()) return;
  rdzv::Json report = fault_report_.json(exit_code == 0 ? "succeeded" : "failed");
  // What the last workers wrote as their results, by global rank.
  rdzv::Json results = rdzv::Json::object();
  const int offset = machine_ ? machine_->round().rank_offset : 0;
  for (std::size_t i = 0; i < result_files_.size(); ++i) {
    std::ifstream in(result_files_[i]);
    std::string result;
    if (in && std::getline(in, result))
      results[std::to_string(offset + static_cast<int>(i))] = result;
  }
  report["results"] = std::move(results);
  // FILE.html: the report as a page (a timeline per worker); any other name: JSON.
  const std::string& path = options_.fault_report;
  const bool page = path.size() >= 5 && path.compare(path.size() - 5, 5, ".html") == 0;
  const std::string text =
      page ? fault_timeline_.html(report, std::chrono::system_clock::now()) : report.dump(2) + "\n";
  std::ofstream out(options_.fault_report, std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    log("error: --fault_report: cannot write '" + options_.fault_report +
        "': " + std::strerror(errno));
  }
}

void Agent::Impl::arm_waiting_line() {
  waiting_line_timer_.expires_after(kWaitingLineInterval);  // (cancelling one armed before)
  waiting_line_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    say_what_it_waits_for();
    arm_waiting_line();
  });
}

void Agent::Impl::say_what_it_waits_for() {
  using Phase = AgentMachine::Phase;
  const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - waiting_since_;
  const std::string since = std::to_string(std::llround(waited.count())) + " s";
  const std::string where = rdzv::format_endpoint({endpoint_host_, endpoint_port_});
  const std::string limit = std::to_string(rdzv::to_millis(config_.join_timeout) / 1000) + " s";
  const std::string attempt =
      last_attempt_.empty() ? "no answer yet" : "last attempt: " + last_attempt_;
  if (reconnecting_) {
    log("still reconnecting to the rendezvous at " + where + " after " + since + " (" + attempt +
        "); trying for up to " + limit + "; workers keep running");
  } else if (phase_ == Phase::kConnecting) {
    log("still connecting to the rendezvous at " + where + " after " + since + " (" + attempt +
        "); trying for up to " + limit);
  } else if (phase_ == Phase::kJoining) {
    log("waiting for the round to form at " + where + " for " + since + " (" +
        std::to_string(options_.min_nodes) + " to " + std::to_string(options_.max_nodes) +
        " nodes; join timeout " + limit + ")");
  } else if (phase_ == Phase::kFinishing) {
    log("this node's workers are done; waiting for the other nodes to finish for " + since +
        " (up to 300 s)");
  }
}

// Checked often enough that a hang is seen within a fifth of the timeout (at least every 1 s).
void Agent::Impl::arm_heartbeat_check() {
  const auto interval = std::clamp<rdzv::Duration>(
      seconds(options_.worker_timeout / 5), std::chrono::milliseconds(50), std::chrono::seconds(1));
  heartbeat_timer_.expires_after(interval);
  heartbeat_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    check_heartbeats();
    arm_heartbeat_check();
  });
}

void Agent::Impl::check_heartbeats() {
  if (!machine_ || !machine_->watching_workers()) return;
  const rdzv::RoundAssignment& round = machine_->round();
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < heartbeat_files_.size(); ++i) {
    heartbeats_.observe(static_cast<int>(i), modification_stamp(heartbeat_files_[i]), now);
  }
  for (int local_rank : heartbeats_.take_overdue(now)) {
    char why[128];
    std::snprintf(why, sizeof why, "no heartbeat for %.1f s (--worker_timeout=%g): killed as hung",
                  std::chrono::duration<double>(heartbeats_.silent_for(local_rank, now)).count(),
                  options_.worker_timeout);
    log("worker rank " + std::to_string(round.rank_offset + local_rank) + " (local rank " +
        std::to_string(local_rank) + "): " + std::string(why));
    event("worker_hung", {{"rank", round.rank_offset + local_rank},
                          {"local_rank", local_rank},
                          {"reason", std::string(why)}});
    write_error_file_if_absent(worker_dir(local_rank) + "/error.json", why);
    const int pid = workers_->running_pid(local_rank);
    if (pid == 0) continue;  // it exited meanwhile; that exit is on its way
    hung_stacks_[pid] = "";
    asio::co_spawn(io_, kill_hung_worker(local_rank, pid), asio::detached);
  }
}

Task<void> Agent::Impl::kill_hung_worker(int local_rank, int pid) {
  const std::string who = "worker rank " +
                          std::to_string(machine_->round().rank_offset + local_rank) +
                          " (local rank " + std::to_string(local_rank) + ")";
  const auto index = static_cast<std::size_t>(local_rank);
  const std::string place = index < stderr_places_.size() ? stderr_places_[index] : "its stderr";
  NativeStacks stacks =
      co_await capture_native_stacks(io_.get_executor(), pid, kNativeStacksTimeout);
  // Gone meanwhile (the group was stopped for another reason): a new group may use this rank.
  if (workers_->running_pid(local_rank) != pid) co_return;
  hung_stacks_[pid] = stacks.text;
  workers_->write_stderr_note(local_rank, "ctrun: " + who + " hung: native stacks (eu-stack -p " +
                                              std::to_string(pid) + "):\n" + stacks.text);
  if (stacks.taken) {
    log(who + ": native stacks (eu-stack) written to " + place);
  } else {
    // One log line: eu-stack's words (its error, a timeout, the hint), not frames.
    std::string why;
    std::istringstream lines(stacks.text);
    for (std::string line; std::getline(lines, line) && why.size() < 600;) {
      if (!line.empty() && line[0] != '#') why += (why.empty() ? "" : "; ") + line;
    }
    log(who + ": no native stacks: " + why.substr(0, 600));
  }
  if (workers_run_python_) {
    // The abort is the agent's: no core file of what may be a process of many GiB.
    const rlimit no_core{0, 0};
    prlimit(pid, RLIMIT_CORE, &no_core, nullptr);
    workers_->signal_process(local_rank, SIGABRT);
    log(who + ": sent SIGABRT: Python stacks (faulthandler) to " + place);
    const auto deadline = std::chrono::steady_clock::now() + kPythonStacksTimeout;
    while (workers_->running_pid(local_rank) == pid &&
           std::chrono::steady_clock::now() < deadline) {
      co_await linger(std::chrono::milliseconds(20));
    }
  }
  // SIGKILL: a hung process may not run a SIGTERM handler. Its exit restarts the job.
  if (workers_->running_pid(local_rank) == pid) workers_->kill(local_rank, SIGKILL);
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
  if (auto hung = hung_stacks_.find(exit.pid); hung != hung_stacks_.end()) {
    info.hung = true;
    info.native_stacks = hung->second;
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
      co_await linger(std::chrono::milliseconds(20));
    }
  }
  std::vector<FailureInfo> infos;
  for (const WorkerExit& f : failed) infos.push_back(failure_info(f));
  const std::string report = format_failure_report(infos);
  std::fputs(report.c_str(), stderr);
  say_lost_logs();
  // Built before the co_await: g++ 12 mishandles conditional temporaries inside its operand.
  std::string summary = failure_summary(infos.front());
  if (infos.size() > 1) summary += " (and " + std::to_string(infos.size() - 1) + " more ranks)";
  event("job_end", {{"state", "failed"}, {"reason", summary}});
  log(std::string(kJobFailedLine) + summary);  // as the other nodes' agents log it
  (void)co_await client_->report(false, summary);
  co_await linger(std::chrono::milliseconds(200));  // let the job's end reach the other nodes
  post({.kind = AgentInput::Kind::kRendezvousTold});
}

Agent::Agent(asio::io_context& io, LaunchOptions options, int local_world_size, AgentWorld world)
    : impl_(std::make_unique<Impl>(io, std::move(options), local_world_size, std::move(world))) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }

}  // namespace ctrun::launcher
