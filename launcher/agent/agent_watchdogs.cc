// The agent's watchdog services: the two that torch's agent offers through its environment,
// TORCHELASTIC_ENABLE_FILE_TIMER (the workers' file timers, file_timer_server.h) and
// TORCHELASTIC_HEALTH_CHECK_PORT (a liveness endpoint for a scheduler's probe), and ctrun's
// straggler watch (straggler_watch.h) and node health checks before each join
// (node_health.h).
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "launcher/agent/agent_impl.h"
#include "launcher/agent/agent_os.h"
#include "launcher/workers/file_timers.h"
#include "rendezvous/base/log.h"

namespace ctrun::launcher {

rdzv::Status Agent::Impl::start_file_timer() {
  const char* enabled = std::getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
  if (!enabled || std::string_view(enabled) != "1") return rdzv::ok_status();
  const char* given = std::getenv("TORCHELASTIC_TIMER_FILE");
  const std::string path = given && *given ? given : default_file_timer_path(random_uuid());
  FileTimerServer::Hooks hooks;
  hooks.worker_of_group = [this](int pgid) -> std::optional<int> {
    for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
      if (workers_->running_pid(local_rank) == pgid) return local_rank;
    }
    return std::nullopt;
  };
  hooks.reaped = [this](const FileTimerReap& reap) { file_timer_expired(reap); };
  hooks.say = [](const std::string& line) { log("warning: " + line); };
  auto server = FileTimerServer::create(io_, path, std::move(hooks));
  if (!server) return server.error();
  file_timer_ = std::move(server).value();
  log("file timer server on " + path + " (TORCHELASTIC_ENABLE_FILE_TIMER=1)");
  return rdzv::ok_status();
}

void Agent::Impl::file_timer_expired(const FileTimerReap& reap) {
  const int rank = machine_ ? machine_->round().rank_offset + reap.local_rank : reap.local_rank;
  const bool worker_itself = workers_->running_pid(reap.local_rank) == reap.pid;
  const std::string why =
      "file timer '" + reap.signal_scope + "' expired: killed with " + signal_name(reap.signal);
  log("worker rank " + std::to_string(rank) + " (local rank " + std::to_string(reap.local_rank) +
      (worker_itself ? ", pid " : ", its process ") + std::to_string(reap.pid) +
      "): expired file timers " + scope_list(reap.scopes) + ": sent " + signal_name(reap.signal));
  event("file_timer_expired", {{"rank", rank},
                               {"local_rank", reap.local_rank},
                               {"pid", reap.pid},
                               {"scopes", reap.scopes},
                               {"signal", signal_name(reap.signal)}});
  // The failure report names the timer, not just the signal, when the worker dies of it.
  if (worker_itself) write_error_file_if_absent(worker_dir(reap.local_rank) + "/error.json", why);
}

rdzv::Status Agent::Impl::start_health_check() {
  const char* value = std::getenv("TORCHELASTIC_HEALTH_CHECK_PORT");
  if (!value) return rdzv::ok_status();
  const std::optional<std::uint16_t> port = health_check_port(value);
  if (!port) {
    // torch's agent says the same and goes on without it.
    log("warning: TORCHELASTIC_HEALTH_CHECK_PORT='" + std::string(value) +
        "' is not a port number (1-65535): no health check server");
    return rdzv::ok_status();
  }
  auto server = rdzv::HttpServer::create(io_, "", *port, "ctrun",
                                         [this](std::string_view) { return health_reply(); });
  if (!server) {
    return rdzv::Error{server.error().code, "TORCHELASTIC_HEALTH_CHECK_PORT=" + std::string(value) +
                                                ": " + server.error().message};
  }
  health_server_ = std::move(server).value();
  health_server_->start();
  log("health check on http://" + health_server_->endpoint() +
      "/ (TORCHELASTIC_HEALTH_CHECK_PORT)");
  return rdzv::ok_status();
}

// Answered by the agent's own event loop, so an answer is the proof of life: an agent that is
// stuck answers nothing and the probe's timeout fails it. The body says where the agent is.
rdzv::HttpReply Agent::Impl::health_reply() const {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  rdzv::Json body = {
      {"status", "alive"},
      {"alive_time", std::chrono::duration_cast<std::chrono::seconds>(now).count()},
      {"phase", phase_name(phase_)},
      {"run_id", run_id_},
      {"node", node_id_},
      {"restart_count", machine_ ? machine_->restart_count() : 0},
  };
  if (machine_ && machine_->workers_running()) {
    rdzv::Json workers = rdzv::Json::array();
    const rdzv::RoundAssignment& round = machine_->round();
    body["group_rank"] = round.group_rank;
    for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
      workers.push_back({{"rank", round.rank_offset + local_rank},
                         {"local_rank", local_rank},
                         {"pid", workers_->running_pid(local_rank)}});
    }
    body["workers"] = std::move(workers);
  }
  return {200, "application/json", body.dump() + "\n"};
}

std::unique_ptr<HungWorkerWatch> Agent::Impl::make_hung_worker_watch() {
  HungWorkerWatch::Settings settings;
  settings.timeout = options_.worker_timeout;
  settings.hang_report_timeout = options_.hang_report_timeout;
  HungWorkerWatch::Hooks hooks;
  hooks.log = [](const std::string& line) { log(line); };
  hooks.watching = [this] { return machine_ && machine_->watching_workers(); };
  auto who = [this](int local_rank) {
    return "worker rank " + std::to_string(machine_->round().rank_offset + local_rank) +
           " (local rank " + std::to_string(local_rank) + ")";
  };
  hooks.who = who;
  hooks.found = [this, who](int local_rank, int pid, const std::string& why) {
    const int rank = machine_->round().rank_offset + local_rank;
    log(who(local_rank) + ": " + why);
    event("worker_hung", {{"rank", rank}, {"local_rank", local_rank}, {"reason", why}});
    write_error_file_if_absent(worker_dir(local_rank) + "/error.json", why);
    // Every rank's stacks before this one is killed and the job restarts (one report for the
    // ranks found hung together).
    if (pid != 0) start_hang_report("worker rank " + std::to_string(rank) + " hung: " + why);
  };
  hooks.reporting = [this] { return hang_report_pending_ || (dumps_ && dumps_->answering()); };
  hooks.stderr_place = [this](int local_rank) {
    const auto slot = static_cast<std::size_t>(local_rank);
    return slot < stderr_places_.size() ? stderr_places_[slot] : std::string("its stderr");
  };
  hooks.python = [this] { return workers_run_python_; };
  return std::make_unique<HungWorkerWatch>(io_, settings, *workers_, heartbeat_files_,
                                           std::move(hooks));
}

void Agent::Impl::start_straggler_watch() {
  const double factor = options_.straggler_factor.value_or(2.0);
  if (!heartbeat_files_on() || factor <= 0) return;
  StragglerSettings settings;
  settings.factor = factor;
  settings.window = options_.straggler_window;
  settings.interval = std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(seconds(options_.straggler_interval)),
      std::chrono::milliseconds(100));
  StragglerWatch::Hooks hooks;
  hooks.running = [this](int local_rank) { return workers_->running_pid(local_rank) != 0; };
  hooks.progress = [this](int local_rank) { return heartbeat_files_.progress(local_rank); };
  hooks.process = [this](int local_rank) {
    return read_process_stats(workers_->running_pid(local_rank));
  };
  hooks.set = [this](std::string key, std::string value) -> Task<rdzv::Status> {
    co_return co_await client_->set(std::move(key), std::move(value));
  };
  hooks.get = [this](std::string key) -> Task<rdzv::Result<std::string>> {
    co_return co_await client_->get(std::move(key), std::chrono::milliseconds(0));
  };
  hooks.log = [](const std::string& line) { log(line); };
  hooks.event = [this](const std::string& name, rdzv::Json fields) {
    event(name, std::move(fields));
  };
  stragglers_ = std::make_shared<StragglerWatch>(io_.get_executor(), settings, std::move(hooks));
}

void Agent::Impl::start_node_health() {
  HealthSettings settings;
  settings.command = options_.health_check;
  settings.command_timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(seconds(options_.health_check_timeout));
  settings.interval = std::chrono::duration_cast<std::chrono::milliseconds>(
      seconds(options_.health_check_interval));
  settings.min_free_bytes = static_cast<std::uint64_t>(options_.health_min_free_mib) << 20;
  settings.dirs = {log_root_};
  settings.dirs.insert(settings.dirs.end(), options_.health_check_dirs.begin(),
                       options_.health_check_dirs.end());
  NodeHealth::Hooks hooks;
  hooks.log = [](const std::string& line) { log(line); };
  hooks.event = [this](const std::string& name, rdzv::Json fields) {
    event(name, std::move(fields));
  };
  health_ = std::make_unique<NodeHealth>(io_.get_executor(), std::move(settings),
                                         rdzv::local_host_name(), std::move(hooks));
}

}  // namespace ctrun::launcher
