// The agent's loop: what happens (the rendezvous' news, workers' exits, signals) goes to its
// machine (agent_machine.h) as input, and what the machine decides is carried out here; the
// rendezvous is reached, hosted and rejoined here too. Workers: agent_workers.cc; --faults:
// fault_runner.h.
#include "launcher/agent/agent_impl.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "ctrun/rendezvous/endpoint.h"
#include "launcher/agent/agent_os.h"
#include "launcher/agent/hosted_rendezvous.h"
#include "launcher/agent/rendezvous_plan.h"
#include "launcher/workers/adopted_children.h"
#include "launcher/workers/worker_group.h"
#include "python_helper.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/base/log.h"
#include "rendezvous/base/random.h"
#include "rendezvous/base/token.h"

namespace ctrun::launcher {

namespace {

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

}  // namespace

Agent::Impl::Impl(asio::io_context& io, LaunchOptions options, int local_world_size,
                  AgentWorld world)
    : io_(io),
      options_(std::move(options)),
      local_world_size_(local_world_size),
      world_(std::move(world)),
      wake_(io),
      signals_(io),
      stdin_(io),
      barrier_(io),
      waiting_line_timer_(io),
      workers_(world_.make_workers ? world_.make_workers(io) : std::make_unique<WorkerGroup>(io)),
      adopted_timer_(io),
      hung_workers_(make_hung_worker_watch()) {}

void Agent::Impl::log(const std::string& line) { rdzv::log_line("ctrun", line); }

rdzv::Duration Agent::Impl::seconds(double s) {
  return std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(s));
}

int Agent::Impl::run() {
  if (auto s = open_event_logs(); !s) {
    log("error: " + s.error().message);
    return kAgentExitFailure;
  }
  if (!world_.adopt_orphans) {
    // (a test's in-memory workers have no descendants)
  } else if (auto s = become_child_subreaper(); !s) {
    log("warning: " + s.error().message + ": descendants of workers that outlive them go to init");
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
  if (faults_) faults_->finish(code, machine_ ? machine_->round().rank_offset : 0);
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

rdzv::Status Agent::Impl::setup() {
  const LaunchOptions& o = options_;
  for (const auto& w : o.warnings) log("warning: " + w);
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
  if (!o.faults.empty() || !o.fault_report.empty()) {
    if (auto s = start_fault_runner(); !s) return s;
  }
  if (heartbeat_files_on() || o.flight_recorder || o.fault_tolerance == "step") {
    // Python workers report their steps and results (and raise a planned exception) through
    // ctrun's helper, and train per-step fault tolerant with it; its sitecustomize.py lets the
    // agent take their stacks (hang reports).
    const std::string dir = log_root_ + "/" + run_id_ + "/python";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    for (const auto& [name, source] : {std::pair{kPythonHelperName, kPythonHelperSource},
                                       std::pair{kSiteCustomizeName, kSiteCustomizeSource}}) {
      const std::string path = dir + "/" + name;
      if (ec || !write_text_file_atomically(path, source)) {
        return rdzv::Error{rdzv::ErrorCode::kInternal,
                           "cannot write '" + path +
                               "': " + (ec ? ec.message() : std::string(std::strerror(errno)))};
      }
    }
    python_helper_dir_ = dir;
  }
  stacks_ = make_node_stacks();
  if (o.fault_tolerance == "step") {
    // The workers' proxy is this very executable (`ctrun worker-proxy`).
    std::error_code ec;
    worker_proxy_ = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  }

  probe_workers_torch();

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
    auto hosted = o.standalone ? host_standalone() : host_rendezvous();
    if (hosted) {
      backend.endpoints.front() = {endpoint_host_, endpoint_port_};
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
  if (faults_) client_ = faults_->wrap_backend(std::move(client_));  // a cut-off's switch
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

// torch 2.x's --standalone: the workers' store on this node's address, --local_addr or the
// fully qualified host name, which MASTER_ADDR then names. Where nothing can listen there (a
// name for an address this network namespace lacks), 127.0.0.1 as before.
rdzv::Status Agent::Impl::host_standalone() {
  const std::string loopback = endpoint_host_;
  endpoint_host_ = !options_.local_addr.empty() ? options_.local_addr : fully_qualified_host_name();
  if (endpoint_host_ != loopback) {
    auto hosted = host_rendezvous();
    if (hosted) return hosted;
    log("--standalone: cannot listen on " + endpoint_host_ + " (" + hosted.error().message +
        "): the job's store is on " + loopback + " instead");
    endpoint_host_ = loopback;
    endpoint_port_ = 0;
  }
  return host_rendezvous();
}

// The rendezvous this agent hosts, on endpoint_host_:endpoint_port_ (0: any free port).
rdzv::Status Agent::Impl::host_rendezvous() {
  rdzv::ServerOptions server_options = hosted_rendezvous_options(options_.rdzv_conf, endpoint_host_,
                                                                 endpoint_port_, token_, run_id_);
  server_options.service.events = hosted_events();
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

rdzv::Status Agent::Impl::start_fault_runner() {
  FaultRunner::Hooks hooks;
  hooks.log = [](const std::string& line) { log(line); };
  hooks.event = [this](const std::string& name, rdzv::Json fields) {
    event(name, std::move(fields));
  };
  hooks.step = [this](int local_rank) { return heartbeat_files_.step(local_rank); };
  hooks.worker_dir = [this](int local_rank) { return worker_dir(local_rank); };
  hooks.stop_rendezvous = [this] {
    if (!server_) return false;
    server_->stop();
    server_.reset();
    return true;
  };
  hooks.start_rendezvous = [this] { return host_rendezvous(); };
  hooks.exiting = [this] { return exiting_; };
  auto runner = FaultRunner::create(io_, options_, node_id_, *workers_, std::move(hooks));
  if (!runner) return runner.error();
  faults_ = std::move(runner).value();
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
  if (connected.status && !dumps_) start_dump_watch();  // hang reports: every agent answers
  if (connected.status && faults_) faults_->connected(host_);
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
  // Workers start only once connected: by then the workers' torch is known (its probe ran
  // beside the connect), so no start waits on it.
  co_await torch_probed();
  if (exiting_) co_return;
  post(std::move(connected));
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
  hung_workers_->start();

  // The health port first: a probe has its answer while the rendezvous is still being reached.
  rdzv::Status started = start_health_check();
  if (started) started = setup();
  if (started) started = start_file_timer();
  if (started) start_straggler_watch();
  if (started) start_node_health();
  if (!started) {
    log("error: " + started.error().message);
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
        if (!ok) co_await rdzv::sleep_for(std::chrono::milliseconds(200));
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
      if (dumps_) dumps_->stop();
      exit_signal_ = a.signo;
      co_return a.code;
  }
  co_return std::nullopt;
}

Task<void> Agent::Impl::await_failure_window() {
  const auto window = std::chrono::steady_clock::now() + seconds(options_.monitor_interval);
  while (workers_->running() > 0 && std::chrono::steady_clock::now() < window) {
    co_await rdzv::sleep_for(std::chrono::milliseconds(5));
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
    // An unhealthy node does not join: it checks again, or gives up at the join timeout.
    if (health_) {
      auto healthy = co_await health_->wait_until_healthy(config_.join_timeout);
      if (!healthy) {
        post({.kind = AgentInput::Kind::kJoined, .joined = healthy.error()});
        co_return;
      }
    }
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
  } else if (phase_ == Phase::kJoining && health_ && !health_->unhealthy().empty()) {
    // Each failed check says its own line; this one says how long it has been out.
    log("not joining for " + since + ": this node is unhealthy (" + health_->unhealthy() +
        "); join timeout " + limit);
  } else if (phase_ == Phase::kJoining) {
    log("waiting for the round to form at " + where + " for " + since + " (" +
        std::to_string(options_.min_nodes) + " to " + std::to_string(options_.max_nodes) +
        " nodes; join timeout " + limit + ")");
  } else if (phase_ == Phase::kFinishing) {
    log("this node's workers are done; waiting for the other nodes to finish for " + since +
        " (up to 300 s)");
  }
}

Agent::Agent(asio::io_context& io, LaunchOptions options, int local_world_size, AgentWorld world)
    : impl_(std::make_unique<Impl>(io, std::move(options), local_world_size, std::move(world))) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }

}  // namespace ctrun::launcher
