#include "launcher/agent/agent_machine.h"

#include <csignal>

#include "ctrun/launcher/options.h"
#include "ctrun/rendezvous/endpoint.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

AgentMachine::AgentMachine(AgentMachineConfig config) : config_(std::move(config)) {}

std::vector<AgentAction> AgentMachine::start() {
  out_.clear();
  emit({.kind = AgentAction::Kind::kConnect});
  return std::move(out_);
}

std::vector<AgentAction> AgentMachine::handle(const AgentInput& input) {
  out_.clear();
  if (phase_ == Phase::kDone) return {};
  connected_ = input.connected;
  if (input.kind == AgentInput::Kind::kSignal) {
    on_signal(input);
  } else if (waiting() && !awaited(input)) {
    kept_.push_back(input);
  } else {
    act(input);
  }
  // News kept while waiting, once nothing is awaited any more (a join's answer is not awaited:
  // anything may happen while a round gathers).
  while (phase_ != Phase::kDone && !waiting() && !kept_.empty()) {
    AgentInput next = std::move(kept_.front());
    kept_.pop_front();
    next.connected = input.connected;
    act(next);
  }
  if (phase_ == Phase::kDone) kept_.clear();
  return std::move(out_);
}

bool AgentMachine::waiting() const {
  return reconnecting_ || phase_ == Phase::kConnecting || phase_ == Phase::kStarting ||
         phase_ == Phase::kFailing || phase_ == Phase::kStopping || phase_ == Phase::kCounting ||
         phase_ == Phase::kEnding;
}

bool AgentMachine::awaited(const AgentInput& input) const {
  using K = AgentInput::Kind;
  if (reconnecting_ && input.kind == K::kReconnected) return true;
  switch (phase_) {
    case Phase::kConnecting:
      return input.kind == K::kConnected;
    case Phase::kStarting:
      return input.kind == K::kWorkersStarted;
    case Phase::kFailing:
      return input.kind == K::kFailureWindowOver;
    case Phase::kStopping:
      return input.kind == K::kWorkersStopped;
    case Phase::kCounting:
      return input.kind == K::kRestartCounted;
    case Phase::kEnding:
      return input.kind == K::kRendezvousTold;
    default:
      return false;
  }
}

void AgentMachine::act(const AgentInput& input) {
  using K = AgentInput::Kind;
  switch (input.kind) {
    case K::kConnected:
      if (!input.status) {
        log("error: " + input.status.error().message);
        finish(kAgentExitFailure);
        return;
      }
      join();
      return;
    case K::kJoined:
      on_joined(input);
      return;
    case K::kWorkersStarted:
      if (phase_ != Phase::kStarting) return;
      if (!input.status) {
        workers_up_ = false;
        const std::string message = input.status.error().message;
        log("error: " + message);
        emit({.kind = AgentAction::Kind::kReportResult, .text = message, .ok = false});
        end_after_telling(kAgentExitFailure);
        return;
      }
      phase_ = Phase::kRunning;
      return;
    case K::kWorkerExit:
      on_worker_exit(input);
      return;
    case K::kFailureWindowOver:
      if (phase_ == Phase::kFailing) stop_then(AfterStop::kFailureReport, SIGTERM);
      return;
    case K::kWorkersStopped:
      if (phase_ == Phase::kStopping) after_stop();
      return;
    case K::kRestartCounted:
      on_restart_counted(input);
      return;
    case K::kRoundReopened:
      on_round_reopened(input.round, input.reason);
      return;
    case K::kJobEnded:
      on_job_ended(input.state, input.reason);
      return;
    case K::kConnectionLost:
      on_connection_lost(input);
      return;
    case K::kReconnected:
      on_reconnected(input);
      return;
    case K::kBarrierExpired:
      if (phase_ != Phase::kFinishing) return;
      log("warning: other nodes did not finish within 300 s; exiting");
      finish(0);
      return;
    case K::kRendezvousTold:
      if (phase_ == Phase::kEnding) finish(exit_code_);
      return;
    case K::kSignal:
      on_signal(input);
      return;
  }
}

void AgentMachine::on_signal(const AgentInput& input) {
  const int signo = input.signo;
  const std::string name = signal_name(signo);
  if (!started_once_) exit_signal_ = signo;
  if (stop_signalled_) {
    // A second stop: the user means now. The workers' process groups are killed on exit.
    log("received " + name + " again: stopping at once");
    record("signal", {{"signal", name}, {"action", "exit"}});
    finish(kAgentExitFailure);
    return;
  }
  stop_signalled_ = true;
  record("signal", {{"signal", name}, {"action", "stop"}});
  switch (phase_) {
    case Phase::kConnecting:
      log("received " + name + " while connecting to the rendezvous at " + config_.endpoint +
          ": exiting");
      finish(kAgentExitFailure);
      return;
    case Phase::kFinishing:
    case Phase::kEnding:
      // This node's workers are done or stopped and the rendezvous told or being told.
      log("received " + name + ": exiting");
      finish(kAgentExitFailure);
      return;
    case Phase::kStopping:
      // A stop is under way: once it ends, leave and exit instead of what was planned.
      log("received " + name + ": stopping workers");
      after_stop_ = AfterStop::kLeaveAndExit;
      return;
    default:
      break;
  }
  if (workers_up_) {
    log("received " + name + ": stopping workers");
    stop_then(AfterStop::kLeaveAndExit, signo);
    return;
  }
  log("received " + name + ": leaving the rendezvous");
  leave_and_exit(input.connected);
}

void AgentMachine::on_joined(const AgentInput& input) {
  join_in_flight_ = false;
  if (config_.replace_failed_workers && workers_up_ && phase_ == Phase::kRunning) {
    return on_rejoined(input);
  }
  if (phase_ != Phase::kJoining) return;
  const auto& joined = *input.joined;
  if (!joined.ok() && joined.error().code == rdzv::ErrorCode::kConnection) {
    // The connection went while the join waited; once it is back (a reconnect), join again.
    if (connected_) join();
    return;
  }
  if (!joined.ok()) {
    log("error: rendezvous failed: " + joined.error().message);
    record("join_failed", {{"reason", joined.error().message}});
    finish(kAgentExitFailure);
    return;
  }
  round_ = joined.value();
  restart_count_ = std::max(round_.restart_count, 0);
  rdzv::Json fields = rdzv::to_json(round_);
  fields["restart"] = restart_count_;
  record("round", std::move(fields));
  log("round " + std::to_string(round_.round) + ": group rank " +
      std::to_string(round_.group_rank) + " of " + std::to_string(round_.group_world_size) +
      ", ranks " + std::to_string(round_.rank_offset) + ".." +
      std::to_string(round_.rank_offset + config_.local_world_size - 1) + " of world size " +
      std::to_string(round_.world_size) + ", master " +
      rdzv::format_endpoint({round_.master_addr, static_cast<std::uint16_t>(round_.master_port)}) +
      ", restart " + std::to_string(restart_count_));
  phase_ = Phase::kStarting;
  started_once_ = true;
  workers_up_ = true;  // a start that fails leaves none: kWorkersStarted says
  exited_ok_ = 0;
  emit(
      {.kind = AgentAction::Kind::kStartWorkers, .round = round_, .restart_count = restart_count_});
}

void AgentMachine::on_rejoined(const AgentInput& input) {
  const auto& joined = *input.joined;
  if (!joined.ok() && joined.error().code == rdzv::ErrorCode::kConnection) {
    if (connected_) {
      join_in_flight_ = true;
      emit({.kind = AgentAction::Kind::kJoin});
    }
    return;
  }
  if (!joined.ok()) {
    // Out of the job's rounds, this node's workers would train beside the job: stop them.
    log("error: rendezvous failed: " + joined.error().message);
    record("join_failed", {{"reason", joined.error().message}});
    exit_code_after_stop_ = kAgentExitFailure;
    stop_then(AfterStop::kExit, SIGTERM);
    return;
  }
  round_ = joined.value();
  rdzv::Json fields = rdzv::to_json(round_);
  fields["restart"] = restart_count_;
  fields["workers_run_on"] = true;
  record("round", std::move(fields));
  log("round " + std::to_string(round_.round) + ": group rank " +
      std::to_string(round_.group_rank) + " of " + std::to_string(round_.group_world_size) +
      ", world size " + std::to_string(round_.world_size) + "; the workers run on");
}

void AgentMachine::on_worker_exit(const AgentInput& input) {
  if (phase_ != Phase::kRunning) return;  // from a group already stopped
  const WorkerExit& e = input.exit;
  record("worker_exit", {{"rank", round_.rank_offset + e.local_rank},
                         {"local_rank", e.local_rank},
                         {"worker_pid", e.pid},
                         {"exit_code", e.exit_code},
                         {"signal", e.signal ? signal_name(e.signal) : ""},
                         {"ok", e.ok()}});
  if (e.ok()) {
    if (++exited_ok_ < config_.local_world_size) return;
    workers_up_ = false;
    phase_ = Phase::kFinishing;
    emit({.kind = AgentAction::Kind::kReportResult, .ok = true});
    emit({.kind = AgentAction::Kind::kAwaitBarrier});
    return;
  }
  log("worker rank " + std::to_string(round_.rank_offset + e.local_rank) + " (local rank " +
      std::to_string(e.local_rank) + ", pid " + std::to_string(e.pid) + ") " +
      (e.signal ? "was killed by " + signal_name(e.signal)
                : "exited with code " + std::to_string(e.exit_code)));
  first_failure_ = e;
  count_retried_ = false;
  // The restart is counted first, while the other workers still run: a restart stops them at
  // once; only a job that fails waits for the failure window before its report.
  phase_ = Phase::kCounting;
  emit({.kind = AgentAction::Kind::kCountRestart});
}

void AgentMachine::on_restart_counted(const AgentInput& input) {
  if (phase_ != Phase::kCounting) return;
  const auto& used = input.count;
  if (!used && used.error().code == rdzv::ErrorCode::kConnection && !count_retried_) {
    count_retried_ = true;
    log("lost the rendezvous at " + config_.endpoint + " while restarting (" +
        used.error().message + "): reconnecting");
    reconnecting_ = true;
    reconnect_to_count_ = true;
    emit({.kind = AgentAction::Kind::kReconnect});
    return;
  }
  // The restart budget is the job's, not the node's: one counter in the job's store.
  if (used && used.value() <= config_.max_restarts && config_.replace_failed_workers) {
    const WorkerExit& failed = first_failure_;
    log("replacing worker rank " + std::to_string(round_.rank_offset + failed.local_rank) +
        " (local rank " + std::to_string(failed.local_rank) + "; " + std::to_string(used.value()) +
        " of " + std::to_string(config_.max_restarts) + " restarts); the others run on");
    record(
        "restart",
        {{"used", used.value()}, {"max", config_.max_restarts}, {"local_rank", failed.local_rank}});
    restart_count_ = static_cast<int>(used.value());
    phase_ = Phase::kRunning;
    emit({.kind = AgentAction::Kind::kRestartWorker,
          .restart_count = restart_count_,
          .exit = failed});
    return;
  }
  if (used && used.value() <= config_.max_restarts) {
    log("restarting the job (" + std::to_string(used.value()) + " of " +
        std::to_string(config_.max_restarts) + " restarts)");
    record("restart", {{"used", used.value()}, {"max", config_.max_restarts}});
    stop_then(AfterStop::kJoin, SIGTERM);  // joining again opens the next round for every node
    return;
  }
  // Ranks that fail together are all reported: the others get --monitor-interval to fail too
  // before the group is stopped (torchrun sees them in the same poll of its monitor).
  phase_ = Phase::kFailing;
  emit({.kind = AgentAction::Kind::kAwaitFailureWindow});
}

void AgentMachine::on_connection_lost(const AgentInput& input) {
  if (connected_ || reconnecting_) return;  // already back, or being brought back
  if (phase_ == Phase::kFinishing) {
    finish(0);  // this node is done; the others learn the job's end without it
    return;
  }
  log("lost the rendezvous at " + config_.endpoint + " (" + input.reason +
      "): reconnecting for up to " + std::to_string(config_.join_timeout_s) +
      " s; workers keep running");
  record("rendezvous_lost", {{"endpoint", config_.endpoint}, {"reason", input.reason}});
  reconnecting_ = true;
  reconnect_to_count_ = false;
  emit({.kind = AgentAction::Kind::kReconnect});
}

void AgentMachine::on_reconnected(const AgentInput& input) {
  if (!reconnecting_) return;
  reconnecting_ = false;
  if (stop_signalled_) return;  // the agent is on its way out: the workers' stop decides
  if (reconnect_to_count_) {
    reconnect_to_count_ = false;
    if (!input.status) {
      // Counted as a failed count: the job fails here, reported.
      on_restart_counted(
          AgentInput{.kind = AgentInput::Kind::kRestartCounted, .count = input.status.error()});
      return;
    }
    log("reconnected to the rendezvous");
    emit({.kind = AgentAction::Kind::kCountRestart});
    return;
  }
  if (!input.status) {
    log("error: lost the rendezvous at " + config_.endpoint + ": " + input.status.error().message);
    if (workers_up_) {
      exit_code_after_stop_ = kAgentExitFailure;
      stop_then(AfterStop::kExit, SIGTERM);
    } else {
      finish(kAgentExitFailure);
    }
    return;
  }
  const ResumedPlace& at = input.place;
  if (!at.known) {
    // Dropped while away (its keep-alives stopped), or the daemon restarted without its state.
    record("reconnected", {{"known", false}, {"reason", at.why}});
    if (config_.replace_failed_workers && workers_up_ && phase_ == Phase::kRunning) {
      // The workers' quorum left them out while they were cut off and heals them when they
      // are back: the node only takes its place in the rounds again (the join still out, if
      // one is, is answered on the new connection).
      log("reconnected, but the rendezvous no longer knows this node (" + at.why +
          "): joining again; the workers run on");
      if (!join_in_flight_) {
        join_in_flight_ = true;
        emit({.kind = AgentAction::Kind::kJoin});
      }
      return;
    }
    log("reconnected, but the rendezvous no longer knows this node (" + at.why +
        "): joining again");
    if (workers_up_) {
      stop_then(AfterStop::kJoin, SIGTERM);
    } else if (!join_in_flight_ && phase_ == Phase::kJoining) {
      join();
    }
    return;
  }
  log("reconnected to the rendezvous: round " + std::to_string(at.round) + ", job " + at.state);
  record("reconnected", {{"round", at.round}, {"state", at.state}});
  // What changed while away is news like any other, after what was kept meanwhile (a worker's
  // exit seen during the reconnect comes first).
  if (at.state != "running") {
    kept_.push_back(
        {.kind = AgentInput::Kind::kJobEnded, .state = at.state, .reason = "ended while away"});
  } else if (phase_ == Phase::kRunning && at.round > round_.round) {
    kept_.push_back({.kind = AgentInput::Kind::kRoundReopened,
                     .round = at.round,
                     .reason = "reopened while away"});
  } else if (phase_ == Phase::kJoining && !join_in_flight_) {
    join();  // the answer to the last join was lost with the connection
  }
}

void AgentMachine::on_round_reopened(int round, const std::string& reason) {
  // While joining there is nothing to stop; an old round's news is stale.
  if (phase_ != Phase::kRunning || round <= round_.round) return;
  if (config_.replace_failed_workers) {
    // The job's membership changed: this node takes its place in the new round, and its
    // workers' quorum takes the change in at a step boundary; nobody is stopped.
    if (join_in_flight_) return;
    log("round " + std::to_string(round) + " opened (" + reason +
        "): joining it; the workers run on");
    record("round_reopened", {{"round", round}, {"reason", reason}, {"workers_run_on", true}});
    join_in_flight_ = true;
    emit({.kind = AgentAction::Kind::kJoin});
    return;
  }
  log("round " + std::to_string(round) + " opened (" + reason + "): restarting workers");
  record("round_reopened", {{"round", round}, {"reason", reason}});
  stop_then(AfterStop::kJoin, SIGTERM);
}

void AgentMachine::on_job_ended(const std::string& state, const std::string& reason) {
  const int code = state == "succeeded" ? 0 : kAgentExitFailure;
  if (phase_ == Phase::kFinishing) {
    record("job_end", {{"state", state}, {"reason", reason}});
    finish(0);
    return;
  }
  // "job ended (failed): " is kJobFailedLine, which the launcher of --hostfile looks for.
  log("job ended (" + state + "): " + reason);
  record("job_end", {{"state", state}, {"reason", reason}});
  if (workers_up_) {
    exit_code_after_stop_ = code;
    stop_then(AfterStop::kExit, SIGTERM);
  } else {
    finish(code);
  }
}

void AgentMachine::stop_then(AfterStop after, int signo) {
  after_stop_ = after;
  if (phase_ == Phase::kStopping) return;  // one stop at a time; what follows it is updated
  phase_ = Phase::kStopping;
  emit({.kind = AgentAction::Kind::kStopWorkers, .signo = signo});
}

void AgentMachine::after_stop() {
  workers_up_ = false;
  switch (after_stop_) {
    case AfterStop::kJoin:
      join();
      return;
    case AfterStop::kFailureReport:
      emit({.kind = AgentAction::Kind::kFailureReport, .exit = first_failure_});
      end_after_telling(kAgentExitFailure);
      return;
    case AfterStop::kExit:
      finish(exit_code_after_stop_);
      return;
    case AfterStop::kLeaveAndExit:
      leave_and_exit(connected_);
      return;
  }
}

void AgentMachine::join() {
  phase_ = Phase::kJoining;
  // Exits of the group just stopped must not be read as news about the next one.
  std::erase_if(kept_,
                [](const AgentInput& in) { return in.kind == AgentInput::Kind::kWorkerExit; });
  // A join sent while the workers ran (--fault_tolerance=step) is still out: its answer, kept
  // or to come, is this join's. A second one would make that answer look stale or duplicate.
  if (config_.replace_failed_workers && join_in_flight_) return;
  join_in_flight_ = true;
  emit({.kind = AgentAction::Kind::kJoin});
}

void AgentMachine::leave_and_exit(bool connected) {
  // A goodbye, so that the rendezvous lets this node go at once instead of when its
  // keep-alives run out; without a connection there is no one to tell.
  if (!connected) {
    finish(kAgentExitFailure);
    return;
  }
  emit({.kind = AgentAction::Kind::kLeave});
  end_after_telling(kAgentExitFailure);
}

void AgentMachine::end_after_telling(int code) {
  phase_ = Phase::kEnding;
  exit_code_ = code;
}

void AgentMachine::finish(int code) {
  phase_ = Phase::kDone;
  emit({.kind = AgentAction::Kind::kExit, .signo = exit_signal_, .code = code});
}

void AgentMachine::log(std::string text) {
  emit({.kind = AgentAction::Kind::kLog, .text = std::move(text)});
}

void AgentMachine::record(std::string name, rdzv::Json fields) {
  emit({.kind = AgentAction::Kind::kRecord, .name = std::move(name), .fields = std::move(fields)});
}

const char* phase_name(AgentMachine::Phase phase) {
  using Phase = AgentMachine::Phase;
  switch (phase) {
    case Phase::kConnecting:
      return "connecting";
    case Phase::kJoining:
      return "joining";
    case Phase::kStarting:
      return "starting";
    case Phase::kRunning:
      return "running";
    case Phase::kFailing:
      return "failing";
    case Phase::kStopping:
      return "stopping";
    case Phase::kCounting:
      return "counting";
    case Phase::kFinishing:
      return "finishing";
    case Phase::kEnding:
      return "ending";
    case Phase::kDone:
      return "done";
  }
  return "unknown";
}

}  // namespace ctrun::launcher
