// The agent's decisions as a state machine: what happened comes in as an AgentInput, what to do
// next goes out as AgentActions, in order. Pure: no sockets, processes, signals or clock. The
// agent (agent.cc) carries the actions out and hands back their outcomes as inputs, so every
// decision (restart, re-form or fail, the restart budget, a signal in any phase, a lost
// rendezvous) is tested in memory, input by input (tests/launcher/agent/agent_machine_test.cc).
//
// Phases: connecting -> joining -> starting -> running -> (finishing | counting -> stopping ->
// joining again | counting -> failing -> stopping -> ending) -> done. With
// --fault_tolerance=step a counted restart goes from counting back to running with one worker
// replaced, and a reopened round is joined while running. Some actions take time
// (connect, join, stop, reconnect, the failure window, the restart count); while the machine
// waits for one of those to finish, news other than a signal is kept and acted on once it has
// (as the agent always did, one step at a time), and a signal is acted on at once, whatever the
// phase.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/round.h"
#include "launcher/workers/worker_exit.h"

namespace ctrun::launcher {

inline constexpr int kAgentExitFailure = 1;

// Where a resume() left this node after a reconnect.
struct ResumedPlace {
  bool known = true;              // false: the rendezvous no longer knows the node (`why`)
  int round = 0;                  // the job's current round
  std::string state = "running";  // the job's state: "running", "succeeded", "failed", "closed"
  std::string why{};
};

struct AgentInput {
  enum class Kind {
    kConnected,          // the first connect and the agent's setup on it finished: `status`
    kJoined,             // a join was answered: `joined`
    kWorkersStarted,     // the start of the round's workers: `status`
    kWorkerExit,         // `exit`
    kFailureWindowOver,  // the other workers had --monitor-interval to fail too
    kWorkersStopped,     // every worker is gone after a kStopWorkers
    kRestartCounted,     // the job's restart counter after adding one: `count`
    kRoundReopened,      // `round`, `reason`
    kJobEnded,           // `state`, `reason`
    kConnectionLost,     // `reason`
    kReconnected,        // `status`; when ok, `place`
    kSignal,             // `signo`
    kBarrierExpired,     // the wait for the other nodes after this one succeeded ran out
    kRendezvousTold,     // a kLeave, kReportResult or kFailureReport has been carried out
  };
  Kind kind = Kind::kSignal;
  rendezvous::Status status = rendezvous::ok_status();
  std::optional<rendezvous::Result<rendezvous::RoundAssignment>> joined{};
  WorkerExit exit{};
  rendezvous::Result<std::int64_t> count{};
  int round = 0;
  std::string state{};
  std::string reason{};
  ResumedPlace place{};
  int signo = 0;
  // Whether the backend's connection is up as this input is handed in (the agent fills it in).
  bool connected = true;
};

struct AgentAction {
  enum class Kind {
    kLog,                 // `text` to the console
    kRecord,              // --event_log: event `name` with `fields`
    kConnect,             // connect, keep-alives, the budget in the store -> kConnected
    kJoin,                // join the next round -> kJoined
    kStartWorkers,        // `round`, `restart_count` -> kWorkersStarted
    kAwaitFailureWindow,  // -> kFailureWindowOver
    kStopWorkers,         // `signo`, the grace, then SIGKILL -> kWorkersStopped
    // --fault_tolerance=step: start local rank `exit.local_rank` again, alone, with
    // `restart_count`; the others run on. A start that fails comes back as that rank's exit.
    kRestartWorker,
    kCountRestart,   // add one to the job's restart counter -> kRestartCounted
    kReconnect,      // connect again and resume this node's place -> kReconnected
    kReportResult,   // tell the rendezvous this node's result: `ok`, `text` -> kRendezvousTold
    kFailureReport,  // every failed rank (`exit` first) reported, the job failed -> ditto
    kAwaitBarrier,   // wait for the job's end after success -> kBarrierExpired
    kLeave,          // leave the rendezvous -> kRendezvousTold
    kExit,           // end the agent with `code`; or by signal `signo` when not 0
  };
  Kind kind = Kind::kLog;
  std::string text{};
  std::string name{};
  rendezvous::Json fields{};
  rendezvous::RoundAssignment round{};
  int restart_count = 0;
  int signo = 0;
  bool ok = false;
  WorkerExit exit{};
  int code = 0;
};

struct AgentMachineConfig {
  int local_world_size = 1;
  int max_restarts = 0;
  std::string endpoint;            // the rendezvous as log lines name it
  long long join_timeout_s = 600;  // how long a reconnect keeps trying, for the log line
  // --fault_tolerance=step: a failed worker is replaced alone (each replacement counts against
  // the budget), and a reopened round is joined while the workers run on.
  bool replace_failed_workers = false;
};

class AgentMachine {
 public:
  enum class Phase {
    kConnecting,
    kJoining,
    kStarting,
    kRunning,
    kFailing,
    kStopping,
    kCounting,
    kFinishing,
    kEnding,  // telling the rendezvous this node's end (a leave, a failure), then exit
    kDone,
  };

  explicit AgentMachine(AgentMachineConfig config);

  // The first actions: connect.
  std::vector<AgentAction> start();
  std::vector<AgentAction> handle(const AgentInput& input);

  Phase phase() const { return phase_; }
  bool workers_running() const { return phase_ == Phase::kRunning; }
  // Whether hung workers are looked for: while they run, the restart is counted, and in the
  // failure window.
  bool watching_workers() const {
    return phase_ == Phase::kRunning || phase_ == Phase::kCounting || phase_ == Phase::kFailing;
  }
  bool reconnecting() const { return reconnecting_; }
  // The round the workers run in, and its restart count (for failure reports, hung workers).
  const rendezvous::RoundAssignment& round() const { return round_; }
  int restart_count() const { return restart_count_; }

 private:
  // What follows once a kStopWorkers has finished.
  enum class AfterStop { kJoin, kFailureReport, kExit, kLeaveAndExit };

  bool waiting() const;                         // for an action's outcome, other than a join's
  bool awaited(const AgentInput& input) const;  // the outcome waited for
  void act(const AgentInput& input);
  void on_signal(const AgentInput& input);
  void on_joined(const AgentInput& input);
  void on_worker_exit(const AgentInput& input);
  void on_restart_counted(const AgentInput& input);
  void on_connection_lost(const AgentInput& input);
  void on_reconnected(const AgentInput& input);
  void on_round_reopened(int round, const std::string& reason);
  // --fault_tolerance=step: the answer to a join sent while the workers run.
  void on_rejoined(const AgentInput& input);
  void on_job_ended(const std::string& state, const std::string& reason);
  void stop_then(AfterStop after, int signo);
  void after_stop();
  void join();
  void leave_and_exit(bool connected);
  void finish(int code);
  // The rendezvous is being told (a leave, a report): exit with `code` once it has been.
  void end_after_telling(int code);

  void log(std::string text);
  void record(std::string name, rendezvous::Json fields);
  void emit(AgentAction action) { out_.push_back(std::move(action)); }

  AgentMachineConfig config_;
  Phase phase_ = Phase::kConnecting;
  std::vector<AgentAction> out_;
  std::deque<AgentInput> kept_;  // news that came while an action's outcome was awaited

  bool connected_ = false;           // as of the input being handled
  bool join_in_flight_ = false;      // a join was sent and its answer has not been handled
  bool reconnecting_ = false;        // a kReconnect was sent
  bool reconnect_to_count_ = false;  // ... on the way to counting a restart again
  bool count_retried_ = false;
  bool workers_up_ = false;      // workers were started and not stopped since
  bool stop_signalled_ = false;  // a signal asked the agent to stop
  // Workers were started once. Before that a stop signal ends the agent as the signal's default
  // action would, as torchrun, whose handlers are installed only when it starts workers (after,
  // its SignalException ends it with 1).
  bool started_once_ = false;
  int exit_signal_ = 0;
  AfterStop after_stop_ = AfterStop::kJoin;
  int exit_code_after_stop_ = 0;
  int exit_code_ = 0;  // kEnding's
  rendezvous::RoundAssignment round_;
  int restart_count_ = 0;
  int exited_ok_ = 0;
  WorkerExit first_failure_;
};

// The phase in one lowercase word ("running"), as the health port reports it.
const char* phase_name(AgentMachine::Phase phase);

}  // namespace ctrun::launcher
