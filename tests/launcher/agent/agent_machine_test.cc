// The agent's decisions, input by input, in memory: the end-to-end agent tests
// (agent_test.cc) remain the oracle for the whole; these pin each decision down.
#include "launcher/agent/agent_machine.h"

#include <csignal>

#include "catch.h"

using namespace ctrun::launcher;
namespace rdzv = ctrun::rendezvous;
using Kind = AgentAction::Kind;
using In = AgentInput::Kind;

namespace {

AgentMachineConfig two_workers(int max_restarts = 1) {
  return {.local_world_size = 2, .max_restarts = max_restarts, .endpoint = "head:29400"};
}

std::vector<Kind> kinds(const std::vector<AgentAction>& actions, bool with_output = false) {
  std::vector<Kind> out;
  for (const auto& a : actions) {
    if (!with_output && (a.kind == Kind::kLog || a.kind == Kind::kRecord)) continue;
    out.push_back(a.kind);
  }
  return out;
}

const AgentAction* find(const std::vector<AgentAction>& actions, Kind kind) {
  for (const auto& a : actions) {
    if (a.kind == kind) return &a;
  }
  return nullptr;
}

std::string logs(const std::vector<AgentAction>& actions) {
  std::string text;
  for (const auto& a : actions) {
    if (a.kind == Kind::kLog) text += a.text + "\n";
  }
  return text;
}

rdzv::RoundAssignment round_of(int round, int restart_count = 0) {
  rdzv::RoundAssignment a;
  a.round = round;
  a.group_rank = 0;
  a.group_world_size = 1;
  a.world_size = 2;
  a.master_addr = "head";
  a.master_port = 1234;
  a.restart_count = restart_count;
  return a;
}

AgentInput joined(int round, int restart_count = 0) {
  return {.kind = In::kJoined, .joined = round_of(round, restart_count)};
}
AgentInput exited(int local_rank, int code) {
  return {.kind = In::kWorkerExit,
          .exit = {.local_rank = local_rank, .pid = 100 + local_rank, .exit_code = code}};
}
AgentInput signal(int signo, bool connected = true) {
  return {.kind = In::kSignal, .signo = signo, .connected = connected};
}
AgentInput simple(In kind) { return {.kind = kind}; }

// The rendezvous has been told (a leave, a report): the exit that was waiting for it.
int told(AgentMachine& m) {
  auto actions = m.handle(simple(In::kRendezvousTold));
  REQUIRE(kinds(actions) == std::vector{Kind::kExit});
  return actions.back().code;
}

// A machine whose workers of round `round` run.
AgentMachine running(AgentMachineConfig config = two_workers(), int round = 0) {
  AgentMachine m(config);
  REQUIRE(kinds(m.start()) == std::vector{Kind::kConnect});
  REQUIRE(kinds(m.handle(simple(In::kConnected))) == std::vector{Kind::kJoin});
  REQUIRE(kinds(m.handle(joined(round))) == std::vector{Kind::kStartWorkers});
  REQUIRE(kinds(m.handle(simple(In::kWorkersStarted))).empty());
  REQUIRE(m.workers_running());
  return m;
}

}  // namespace

TEST_CASE("agent machine: a round forms and its workers start with the round's restart count") {
  AgentMachine m(two_workers());
  CHECK(kinds(m.start()) == std::vector{Kind::kConnect});
  CHECK(kinds(m.handle(simple(In::kConnected))) == std::vector{Kind::kJoin});
  auto actions = m.handle(joined(3, 2));
  const AgentAction* start = find(actions, Kind::kStartWorkers);
  REQUIRE(start != nullptr);
  CHECK(start->round.round == 3);
  CHECK(start->restart_count == 2);
  CHECK(logs(actions) ==
        "round 3: group rank 0 of 1, ranks 0..1 of world size 2, master head:1234, restart 2\n");
  CHECK(find(actions, Kind::kRecord)->name == "round");
  CHECK(kinds(m.handle(simple(In::kWorkersStarted))).empty());
  CHECK(m.phase() == AgentMachine::Phase::kRunning);
}

TEST_CASE("agent machine: every worker done reports success and waits for the job's end") {
  AgentMachine m = running();
  CHECK(kinds(m.handle(exited(0, 0))).empty());
  auto actions = m.handle(exited(1, 0));
  CHECK(kinds(actions) == std::vector{Kind::kReportResult, Kind::kAwaitBarrier});
  CHECK(find(actions, Kind::kReportResult)->ok);
  SECTION("the job's end exits 0") {
    auto end = m.handle({.kind = In::kJobEnded, .state = "succeeded"});
    CHECK(kinds(end) == std::vector{Kind::kExit});
    CHECK(find(end, Kind::kExit)->code == 0);
  }
  SECTION("the barrier running out exits 0 with a warning") {
    auto end = m.handle(simple(In::kBarrierExpired));
    CHECK(find(end, Kind::kExit)->code == 0);
    CHECK(logs(end).find("did not finish within 300 s") != std::string::npos);
  }
  SECTION("a stop signal exits 1 at once") {
    auto end = m.handle(signal(SIGTERM));
    CHECK(kinds(end) == std::vector{Kind::kExit});
    CHECK(find(end, Kind::kExit)->code == kAgentExitFailure);
  }
}

TEST_CASE(
    "agent machine: a failure within the budget counts a restart then stops at once and joins") {
  AgentMachine m = running(two_workers(1));
  auto failed = m.handle(exited(1, 3));
  CHECK(kinds(failed) == std::vector{Kind::kCountRestart});
  CHECK(logs(failed) == "worker rank 1 (local rank 1, pid 101) exited with code 3\n");
  // The other rank failing meanwhile is no new decision.
  CHECK(kinds(m.handle(exited(0, 1))).empty());
  // A restart waits for no failure window: the workers are stopped at once.
  auto again = m.handle({.kind = In::kRestartCounted, .count = std::int64_t{1}});
  REQUIRE(kinds(again) == std::vector{Kind::kStopWorkers});
  CHECK(again.back().signo == SIGTERM);
  CHECK(logs(again) == "restarting the job (1 of 1 restarts)\n");
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kJoin});
  // The new round starts fresh: the old group's exit kept during the failure is dropped, and
  // the count of finished workers starts again.
  CHECK(kinds(m.handle(joined(1, 1))) == std::vector{Kind::kStartWorkers});
  CHECK(kinds(m.handle(simple(In::kWorkersStarted))).empty());
  CHECK(kinds(m.handle(exited(0, 0))).empty());
  CHECK(kinds(m.handle(exited(1, 0))) == std::vector{Kind::kReportResult, Kind::kAwaitBarrier});
}

TEST_CASE("agent machine: a failure past the budget reports every failed rank and exits 1") {
  AgentMachine m = running(two_workers(0));
  CHECK(kinds(m.handle(exited(0, 7))) == std::vector{Kind::kCountRestart});
  // Past the budget: the others get the failure window to fail too, then the report.
  CHECK(kinds(m.handle({.kind = In::kRestartCounted, .count = std::int64_t{1}})) ==
        std::vector{Kind::kAwaitFailureWindow});
  CHECK(kinds(m.handle(simple(In::kFailureWindowOver))) == std::vector{Kind::kStopWorkers});
  auto end = m.handle(simple(In::kWorkersStopped));
  REQUIRE(kinds(end) == std::vector{Kind::kFailureReport});
  CHECK(end.back().exit.local_rank == 0);
  CHECK(end.back().exit.exit_code == 7);
  // News while the report is written waits; the exit comes once it is told.
  CHECK(kinds(m.handle({.kind = In::kJobEnded, .state = "failed"})).empty());
  CHECK(told(m) == kAgentExitFailure);
}

TEST_CASE("agent machine: a restart count lost with the connection reconnects and counts again") {
  AgentMachine m = running(two_workers(2));
  m.handle(exited(0, 1));
  auto lost = m.handle({.kind = In::kRestartCounted,
                        .count = rdzv::Error{rdzv::ErrorCode::kConnection, "reset"},
                        .connected = false});
  CHECK(kinds(lost) == std::vector{Kind::kReconnect});
  // The backend's own news of the loss, while the reconnect runs, starts no second one.
  CHECK(kinds(m.handle({.kind = In::kConnectionLost, .connected = false})).empty());
  CHECK(kinds(m.handle(simple(In::kReconnected))) == std::vector{Kind::kCountRestart});
  CHECK(kinds(m.handle({.kind = In::kRestartCounted, .count = std::int64_t{1}})) ==
        std::vector{Kind::kStopWorkers});
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kJoin});
}

TEST_CASE("agent machine: a reopened round restarts the workers and an old round's news does not") {
  AgentMachine m = running(two_workers(), 2);
  CHECK(kinds(m.handle({.kind = In::kRoundReopened, .round = 2})).empty());
  auto reopened = m.handle({.kind = In::kRoundReopened, .round = 3, .reason = "node lost"});
  CHECK(kinds(reopened) == std::vector{Kind::kStopWorkers});
  CHECK(logs(reopened) == "round 3 opened (node lost): restarting workers\n");
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kJoin});
}

TEST_CASE("agent machine: the job's end stops the workers and exits with its state") {
  SECTION("failed elsewhere") {
    AgentMachine m = running();
    CHECK(kinds(m.handle({.kind = In::kJobEnded, .state = "failed", .reason = "rank 3"})) ==
          std::vector{Kind::kStopWorkers});
    auto end = m.handle(simple(In::kWorkersStopped));
    CHECK(find(end, Kind::kExit)->code == kAgentExitFailure);
  }
  SECTION("while joining: nothing to stop") {
    AgentMachine m(two_workers());
    m.start();
    m.handle(simple(In::kConnected));
    auto end = m.handle({.kind = In::kJobEnded, .state = "succeeded"});
    CHECK(kinds(end) == std::vector{Kind::kExit});
    CHECK(find(end, Kind::kExit)->code == 0);
  }
}

TEST_CASE("agent machine: a stop signal is answered in every phase and never kept for later") {
  SECTION("connecting: exit at once") {
    AgentMachine m(two_workers());
    m.start();
    auto end = m.handle(signal(SIGTERM, false));
    REQUIRE(kinds(end) == std::vector{Kind::kExit});
    CHECK(end.back().signo == SIGTERM);  // no workers ever: ended by the signal, as torchrun
    CHECK(logs(end) ==
          "received SIGTERM while connecting to the rendezvous at head:29400: exiting\n");
    // What the abandoned connect says later changes nothing.
    CHECK(m.handle(simple(In::kConnected)).empty());
  }
  SECTION("joining: leave the rendezvous, then exit") {
    AgentMachine m(two_workers());
    m.start();
    m.handle(simple(In::kConnected));
    CHECK(kinds(m.handle(signal(SIGINT))) == std::vector{Kind::kLeave});
    auto end = m.handle(simple(In::kRendezvousTold));
    REQUIRE(kinds(end) == std::vector{Kind::kExit});
    CHECK(end.back().signo == SIGINT);
  }
  SECTION("joining without a connection: nobody to tell") {
    AgentMachine m(two_workers());
    m.start();
    m.handle(simple(In::kConnected));
    CHECK(kinds(m.handle(signal(SIGHUP, false))) == std::vector{Kind::kExit});
  }
  SECTION("running: stop the workers with that signal, leave, exit") {
    AgentMachine m = running();
    auto stop = m.handle(signal(SIGQUIT));
    REQUIRE(kinds(stop) == std::vector{Kind::kStopWorkers});
    CHECK(stop.back().signo == SIGQUIT);
    CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
    auto end = m.handle(simple(In::kRendezvousTold));
    REQUIRE(kinds(end) == std::vector{Kind::kExit});
    CHECK(end.back().code == kAgentExitFailure);  // workers ran: 1, as torchrun's SignalException
    CHECK(end.back().signo == 0);
  }
  SECTION("while a failure's restart is counted: the stop replaces the restart") {
    AgentMachine m = running();
    m.handle(exited(0, 1));
    CHECK(kinds(m.handle(signal(SIGTERM))) == std::vector{Kind::kStopWorkers});
    // The count's answer comes too late to matter.
    CHECK(kinds(m.handle({.kind = In::kRestartCounted, .count = std::int64_t{1}})).empty());
    CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
    CHECK(told(m) == kAgentExitFailure);
  }
  SECTION("in the failure window: the report gives way to the stop") {
    AgentMachine m = running(two_workers(0));
    m.handle(exited(0, 1));
    m.handle({.kind = In::kRestartCounted, .count = std::int64_t{1}});
    CHECK(kinds(m.handle(signal(SIGTERM))) == std::vector{Kind::kStopWorkers});
    CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
    CHECK(told(m) == kAgentExitFailure);
  }
  SECTION("while a restart's stop runs: leave and exit once it ends, no join") {
    AgentMachine m = running();
    m.handle({.kind = In::kRoundReopened, .round = 1});
    CHECK(kinds(m.handle(signal(SIGTERM))).empty());
    CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
    CHECK(told(m) == kAgentExitFailure);
  }
  SECTION("while reconnecting: the workers are stopped at once, not after the reconnect") {
    AgentMachine m = running();
    CHECK(kinds(m.handle({.kind = In::kConnectionLost, .connected = false})) ==
          std::vector{Kind::kReconnect});
    CHECK(kinds(m.handle(signal(SIGTERM, false))) == std::vector{Kind::kStopWorkers});
    CHECK(kinds(m.handle({.kind = In::kWorkersStopped, .connected = false})) ==
          std::vector{Kind::kExit});
  }
  SECTION("a second stop signal exits at once") {
    AgentMachine m = running();
    m.handle(signal(SIGINT));
    auto now = m.handle(signal(SIGINT));
    CHECK(kinds(now) == std::vector{Kind::kExit});
    CHECK(logs(now) == "received SIGINT again: stopping at once\n");
  }
}

TEST_CASE(
    "agent machine: a listed SIGUSR1 goes to the workers, then the job is shut down, as "
    "torch's agent does") {
  AgentMachine m = running();
  auto stop = m.handle(signal(SIGUSR1));
  REQUIRE(kinds(stop) == std::vector{Kind::kStopWorkers});
  CHECK(stop.back().signo == SIGUSR1);  // the workers get it first (a checkpoint on Slurm's)
  CHECK(logs(stop) == "received SIGUSR1: stopping workers\n");
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
  CHECK(told(m) == kAgentExitFailure);
  AgentMachine joining(two_workers());
  joining.start();
  joining.handle(simple(In::kConnected));
  auto leave = joining.handle(signal(SIGUSR2));
  CHECK(logs(leave) == "received SIGUSR2: leaving the rendezvous\n");
}

TEST_CASE("agent machine: a lost rendezvous is reconnected while the workers keep running") {
  SECTION("the node is still known: nothing changes") {
    AgentMachine m = running();
    auto lost = m.handle({.kind = In::kConnectionLost, .reason = "eof", .connected = false});
    CHECK(kinds(lost) == std::vector{Kind::kReconnect});
    CHECK(logs(lost) ==
          "lost the rendezvous at head:29400 (eof): reconnecting for up to 600 s; workers keep "
          "running\n");
    // A worker's exit while away waits for the reconnect, then counts as usual.
    CHECK(kinds(m.handle(exited(0, 0))).empty());
    CHECK(kinds(m.handle({.kind = In::kReconnected, .place = {.round = 0}})).empty());
    CHECK(kinds(m.handle(exited(1, 0))) == std::vector{Kind::kReportResult, Kind::kAwaitBarrier});
  }
  SECTION("the round moved on while away: restart the workers") {
    AgentMachine m = running();
    m.handle({.kind = In::kConnectionLost, .connected = false});
    CHECK(kinds(m.handle({.kind = In::kReconnected, .place = {.round = 4}})) ==
          std::vector{Kind::kStopWorkers});
    CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kJoin});
  }
  SECTION("the node was forgotten: stop and join again") {
    AgentMachine m = running();
    m.handle({.kind = In::kConnectionLost, .connected = false});
    CHECK(kinds(m.handle({.kind = In::kReconnected, .place = {.known = false, .why = "gone"}})) ==
          std::vector{Kind::kStopWorkers});
    CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kJoin});
  }
  SECTION("the job ended while away: stop and exit with its state") {
    AgentMachine m = running();
    m.handle({.kind = In::kConnectionLost, .connected = false});
    CHECK(kinds(m.handle({.kind = In::kReconnected, .place = {.state = "failed"}})) ==
          std::vector{Kind::kStopWorkers});
    CHECK(find(m.handle(simple(In::kWorkersStopped)), Kind::kExit)->code == kAgentExitFailure);
  }
  SECTION("no way back within the join timeout: stop and exit 1") {
    AgentMachine m = running();
    m.handle({.kind = In::kConnectionLost, .connected = false});
    auto failed = m.handle({.kind = In::kReconnected,
                            .status = rdzv::Error{rdzv::ErrorCode::kConnection, "refused"},
                            .connected = false});
    CHECK(kinds(failed) == std::vector{Kind::kStopWorkers});
    CHECK(logs(failed) == "error: lost the rendezvous at head:29400: refused\n");
    CHECK(find(m.handle(simple(In::kWorkersStopped)), Kind::kExit)->code == kAgentExitFailure);
  }
  SECTION("news of a loss already mended is ignored") {
    AgentMachine m = running();
    CHECK(m.handle({.kind = In::kConnectionLost, .connected = true}).empty());
  }
}

TEST_CASE("agent machine: a join cut by a lost connection is sent again once connected") {
  AgentMachine m(two_workers());
  m.start();
  m.handle(simple(In::kConnected));
  const rdzv::Error cut{rdzv::ErrorCode::kConnection, "reset"};
  SECTION("the answer comes after the reconnect") {
    CHECK(kinds(m.handle({.kind = In::kConnectionLost, .connected = false})) ==
          std::vector{Kind::kReconnect});
    // Kept while the reconnect runs; the reconnect leaves the join in flight alone.
    CHECK(kinds(m.handle({.kind = In::kJoined, .joined = cut, .connected = false})).empty());
    CHECK(kinds(m.handle({.kind = In::kReconnected, .place = {.round = 0}})) ==
          std::vector{Kind::kJoin});
  }
  SECTION("the answer comes first: wait for the reconnect, which joins") {
    CHECK(kinds(m.handle({.kind = In::kJoined, .joined = cut, .connected = false})).empty());
    CHECK(kinds(m.handle({.kind = In::kConnectionLost, .connected = false})) ==
          std::vector{Kind::kReconnect});
    CHECK(kinds(m.handle({.kind = In::kReconnected, .place = {.round = 0}})) ==
          std::vector{Kind::kJoin});
  }
}

TEST_CASE("agent machine: a refused join or start fails the agent with the reason") {
  SECTION("join") {
    AgentMachine m(two_workers());
    m.start();
    m.handle(simple(In::kConnected));
    auto end = m.handle(
        {.kind = In::kJoined, .joined = rdzv::Error{rdzv::ErrorCode::kTimeout, "join timed out"}});
    CHECK(kinds(end) == std::vector{Kind::kExit});
    CHECK(logs(end) == "error: rendezvous failed: join timed out\n");
  }
  SECTION("start") {
    AgentMachine m(two_workers());
    m.start();
    m.handle(simple(In::kConnected));
    m.handle(joined(0));
    auto end = m.handle({.kind = In::kWorkersStarted,
                         .status = rdzv::Error{rdzv::ErrorCode::kBadRequest, "no such file"}});
    REQUIRE(kinds(end) == std::vector{Kind::kReportResult});
    CHECK_FALSE(end.back().ok);
    CHECK(end.back().text == "no such file");
    CHECK(told(m) == kAgentExitFailure);
  }
  SECTION("connect") {
    AgentMachine m(two_workers());
    m.start();
    auto end = m.handle(
        {.kind = In::kConnected, .status = rdzv::Error{rdzv::ErrorCode::kConnection, "refused"}});
    CHECK(kinds(end) == std::vector{Kind::kExit});
    CHECK(logs(end) == "error: refused\n");
  }
}

TEST_CASE("agent machine: a reconnect's outcome does not undo a stop signal") {
  AgentMachine m = running();
  m.handle({.kind = In::kConnectionLost, .connected = false});
  CHECK(kinds(m.handle(signal(SIGTERM, false))) == std::vector{Kind::kStopWorkers});
  // Forgotten while away, or the job ended: the agent still leaves and exits, with no join and
  // no second stop.
  const ResumedPlace place =
      GENERATE(ResumedPlace{.known = false, .why = "gone"}, ResumedPlace{.state = "succeeded"});
  CHECK(kinds(m.handle({.kind = In::kReconnected, .place = place})).empty());
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
  CHECK(told(m) == kAgentExitFailure);
}

TEST_CASE("agent machine: news found on reconnect comes after the exits seen while away") {
  AgentMachine m = running();
  m.handle({.kind = In::kConnectionLost, .connected = false});
  m.handle({.kind = In::kWorkerExit, .exit = {.local_rank = 0}, .connected = false});
  m.handle({.kind = In::kWorkerExit, .exit = {.local_rank = 1}, .connected = false});
  // Both workers had finished: this node reports success, then hears the job's end.
  auto actions = m.handle({.kind = In::kReconnected, .place = {.state = "failed"}});
  CHECK(kinds(actions) == std::vector{Kind::kReportResult, Kind::kAwaitBarrier, Kind::kExit});
  CHECK(actions.back().code == 0);
}

TEST_CASE("agent machine: a stop signal while the workers start stops them once started") {
  AgentMachine m(two_workers());
  m.start();
  m.handle(simple(In::kConnected));
  m.handle(joined(0));
  CHECK(kinds(m.handle(signal(SIGTERM))) == std::vector{Kind::kStopWorkers});
  CHECK(kinds(m.handle(simple(In::kWorkersStarted))).empty());
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kLeave});
  CHECK(told(m) == kAgentExitFailure);
}

TEST_CASE("agent machine: a restart count that cannot be had even after a reconnect fails") {
  AgentMachine m = running(two_workers(3));
  m.handle(exited(0, 1));
  const rdzv::Error cut{rdzv::ErrorCode::kConnection, "reset"};
  CHECK(kinds(m.handle({.kind = In::kRestartCounted, .count = cut, .connected = false})) ==
        std::vector{Kind::kReconnect});
  SECTION("the reconnect fails") {
    CHECK(kinds(m.handle({.kind = In::kReconnected, .status = cut, .connected = false})) ==
          std::vector{Kind::kAwaitFailureWindow});
  }
  SECTION("the count fails again") {
    CHECK(kinds(m.handle(simple(In::kReconnected))) == std::vector{Kind::kCountRestart});
    CHECK(kinds(m.handle({.kind = In::kRestartCounted, .count = cut, .connected = false})) ==
          std::vector{Kind::kAwaitFailureWindow});
  }
  CHECK(kinds(m.handle(simple(In::kFailureWindowOver))) == std::vector{Kind::kStopWorkers});
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kFailureReport});
  CHECK(told(m) == kAgentExitFailure);
}

TEST_CASE("agent machine: after success a lost rendezvous or a failed job still exits 0") {
  AgentMachine m = running();
  m.handle(exited(0, 0));
  m.handle(exited(1, 0));
  // A reopened round is no news for a node that is done.
  CHECK(kinds(m.handle({.kind = In::kRoundReopened, .round = 5})).empty());
  SECTION("lost") {
    auto end = m.handle({.kind = In::kConnectionLost, .connected = false});
    REQUIRE(kinds(end) == std::vector{Kind::kExit});
    CHECK(end.back().code == 0);
  }
  SECTION("failed elsewhere") {
    auto end = m.handle({.kind = In::kJobEnded, .state = "failed"});
    REQUIRE(kinds(end) == std::vector{Kind::kExit});
    CHECK(end.back().code == 0);
  }
}

TEST_CASE("agent machine: the job's success elsewhere stops the workers and exits 0") {
  AgentMachine m = running();
  CHECK(kinds(m.handle({.kind = In::kJobEnded, .state = "succeeded"})) ==
        std::vector{Kind::kStopWorkers});
  auto end = m.handle(simple(In::kWorkersStopped));
  REQUIRE(kinds(end) == std::vector{Kind::kExit});
  CHECK(end.back().code == 0);
}

TEST_CASE("agent machine: a missing restart count reads 0") {
  AgentMachine old_daemon(two_workers());
  old_daemon.start();
  old_daemon.handle(simple(In::kConnected));
  auto start = old_daemon.handle(joined(0, -1));
  REQUIRE(find(start, Kind::kStartWorkers) != nullptr);
  CHECK(find(start, Kind::kStartWorkers)->restart_count == 0);
}

namespace {

AgentMachineConfig fault_tolerant(int max_restarts = 2) {
  AgentMachineConfig c = two_workers(max_restarts);
  c.replace_failed_workers = true;
  return c;
}

AgentInput counted(std::int64_t used) { return {.kind = In::kRestartCounted, .count = used}; }

}  // namespace

TEST_CASE("agent machine, fault tolerant: a failed worker is replaced alone, each counted") {
  AgentMachine m = running(fault_tolerant(2));
  CHECK(kinds(m.handle(exited(1, 3))) == std::vector{Kind::kCountRestart});
  // Another exit while the count is on its way is kept for afterwards.
  CHECK(kinds(m.handle(exited(0, 9))).empty());
  auto first = m.handle(counted(1));
  // Rank 1 is replaced; then the kept exit of rank 0 is counted in turn. Nobody is stopped.
  CHECK(kinds(first) == std::vector{Kind::kRestartWorker, Kind::kCountRestart});
  REQUIRE(find(first, Kind::kRestartWorker) != nullptr);
  CHECK(find(first, Kind::kRestartWorker)->exit.local_rank == 1);
  CHECK(find(first, Kind::kRestartWorker)->restart_count == 1);
  CHECK(logs(first).find("replacing worker rank 1 (local rank 1; 1 of 2 restarts); the others "
                         "run on") != std::string::npos);
  auto second = m.handle(counted(2));
  CHECK(kinds(second) == std::vector{Kind::kRestartWorker});
  CHECK(find(second, Kind::kRestartWorker)->exit.local_rank == 0);
  CHECK(m.workers_running());
  CHECK(m.restart_count() == 2);
  // Both replacements finish: the node's result is reported as usual.
  CHECK(kinds(m.handle(exited(1, 0))).empty());
  CHECK(kinds(m.handle(exited(0, 0))) == std::vector{Kind::kReportResult, Kind::kAwaitBarrier});
}

TEST_CASE("agent machine, fault tolerant: past the budget the job fails as without it") {
  AgentMachine m = running(fault_tolerant(1));
  m.handle(exited(0, 1));
  CHECK(kinds(m.handle(counted(1))) == std::vector{Kind::kRestartWorker});
  m.handle(exited(0, 1));
  CHECK(kinds(m.handle(counted(2))) == std::vector{Kind::kAwaitFailureWindow});
  CHECK(kinds(m.handle(simple(In::kFailureWindowOver))) == std::vector{Kind::kStopWorkers});
  CHECK(kinds(m.handle(simple(In::kWorkersStopped))) == std::vector{Kind::kFailureReport});
  CHECK(told(m) == 1);
}

TEST_CASE("agent machine, fault tolerant: a reopened round is joined while the workers run on") {
  AgentMachine m = running(fault_tolerant());
  auto reopened = m.handle({.kind = In::kRoundReopened, .round = 1, .reason = "new node 'b'"});
  CHECK(kinds(reopened) == std::vector{Kind::kJoin});
  CHECK(logs(reopened).find("joining it; the workers run on") != std::string::npos);
  // The same news again while the join is out: nothing more.
  CHECK(kinds(m.handle({.kind = In::kRoundReopened, .round = 1, .reason = "x"})).empty());
  auto rejoined = m.handle(joined(1));
  CHECK(kinds(rejoined).empty());  // no stop, no start
  CHECK(m.workers_running());
  CHECK(m.round().round == 1);
  // A later replacement starts in the new round.
  m.handle(exited(1, 1));
  CHECK(kinds(m.handle(counted(1))) == std::vector{Kind::kRestartWorker});

  // A rejoin the rendezvous refuses: this node's workers must not train beside the job.
  m.handle({.kind = In::kRoundReopened, .round = 2, .reason = "node 'c' lost"});
  auto refused = m.handle({.kind = In::kJoined,
                           .joined = rdzv::Result<rdzv::RoundAssignment>(
                               rdzv::Error{rdzv::ErrorCode::kClosed, "ended"})});
  CHECK(kinds(refused) == std::vector{Kind::kStopWorkers});
  auto stopped = m.handle(simple(In::kWorkersStopped));
  CHECK(kinds(stopped) == std::vector{Kind::kExit});
  CHECK(stopped.back().code == 1);
}

TEST_CASE("agent machine, fault tolerant: a node dropped while away joins again, workers run on") {
  SECTION("no join out: one is sent") {
    AgentMachine m = running(fault_tolerant());
    m.handle({.kind = In::kConnectionLost, .reason = "link down", .connected = false});
    AgentInput back{.kind = In::kReconnected};
    back.place.known = false;
    back.place.why = "keep-alives missed";
    auto rejoin = m.handle(back);
    CHECK(kinds(rejoin) == std::vector{Kind::kJoin});
    CHECK(logs(rejoin).find("joining again; the workers run on") != std::string::npos);
    CHECK(kinds(m.handle(joined(2))).empty());  // no stop, no start
    CHECK(m.workers_running());
    CHECK(m.round().round == 2);
  }
  SECTION("a join still out is not sent twice") {
    AgentMachine m = running(fault_tolerant());
    CHECK(kinds(m.handle({.kind = In::kRoundReopened, .round = 1, .reason = "new node"})) ==
          std::vector{Kind::kJoin});
    CHECK(kinds(m.handle({.kind = In::kConnectionLost, .reason = "gone", .connected = false})) ==
          std::vector{Kind::kReconnect});
    AgentInput back{.kind = In::kReconnected};
    back.place.known = false;
    back.place.why = "keep-alives missed";
    CHECK(kinds(m.handle(back)).empty());
    CHECK(m.phase() == AgentMachine::Phase::kRunning);
    CHECK(kinds(m.handle(joined(2))).empty());
    CHECK(m.workers_running());
    CHECK(m.round().round == 2);
  }
}
