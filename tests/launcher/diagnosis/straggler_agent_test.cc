// Stragglers found while a job runs: two agents on a ctrund, four Python workers reporting
// their steps through ctrun_worker; a straggler injected by --faults is named by both agents
// (a line, an event) and in `ctrun status`, and a job without one names nobody.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <set>
#include <thread>

#include "catch.h"
#include "ctrun/rendezvous/json.h"
#include "ctrund_daemon.h"
#include "event_log.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
using Json = ctrun::rendezvous::Json;

namespace {

// `ctrun status --json` of the job, polled until `done` holds for its "steps" (bounded).
Json status_steps_until(const ScratchDir& s, std::uint16_t port, const std::string& job,
                        const std::function<bool(const Json&)>& done, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  Json steps;
  int n = 0;
  while (std::chrono::steady_clock::now() < until) {
    const std::string out = s.path("status." + std::to_string(n++));
    ChildProcess status({CTRUN_PATH, "status", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                         "--rdzv_id=" + job, "--json"},
                        out);
    if (status.wait(10s) == 0) {
      const Json j = Json::parse(read_file(out), nullptr, false);
      if (j.is_object()) steps = j.value("steps", Json());
      if (steps.is_object() && done(steps)) return steps;
    }
    std::this_thread::sleep_for(300ms);
  }
  return steps;
}

// Two agents of job `job` (2 workers each) on the daemon, each running `script` (by default
// 160 steps of 50 ms that report their steps and do not synchronize); the step times judged over
// 10 steps every `interval` seconds.
std::vector<std::unique_ptr<ChildProcess>> start_job(const ScratchDir& s, std::uint16_t port,
                                                     const std::string& job,
                                                     const std::vector<std::string>& extra,
                                                     std::vector<std::string> script = {},
                                                     const std::string& interval = "0.5") {
  if (script.empty()) script = {REPORT_STEPS_SCRIPT_PATH, "160", s.path("step")};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv = {CTRUN_PATH,
                                     "--nnodes=2",
                                     "--nproc_per_node=2",
                                     "--rdzv_backend=c10d",
                                     "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                     "--rdzv_id=" + job,
                                     "--straggler_factor=2",
                                     "--straggler_window=10",
                                     "--straggler_interval=" + interval,
                                     "--event_log",
                                     s.path("events." + std::to_string(node))};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), script.begin(), script.end());
    agents.push_back(
        std::make_unique<ChildProcess>(argv, s.path("agent." + std::to_string(node) + ".log")));
  }
  return agents;
}

}  // namespace

TEST_CASE("stragglers: an injected straggler is named by every agent and in ctrun status") {
  ScratchDir s("stragglers_found");
  SystemPython python;
  CtrundDaemon daemon;
  // Rank 3 (node 1's local rank 1) runs a quarter of the time from 1 s to 6 s: 4x slower.
  auto agents = start_job(s, daemon.port(), "slow",
                          {"--faults", "straggler:rank=3,after=1,duration=5,speed=0.25"});
  const Json steps = status_steps_until(
      s, daemon.port(), "slow",
      [](const Json& v) { return v.value("stragglers", Json::array()) == Json::array({3}); }, 20s);
  INFO(steps.dump());
  CHECK(steps.value("stragglers", Json()) == Json::array({3}));
  REQUIRE(steps.contains("ranks"));
  CHECK(steps["ranks"].size() == 4);
  for (int node = 0; node < 2; ++node) REQUIRE(agents[node]->wait(90s) == 0);

  for (int node = 0; node < 2; ++node) {
    const std::string log = read_file(s.path("agent." + std::to_string(node) + ".log"));
    INFO(log);
    CHECK(log.find("rank 3 on ") != std::string::npos);
    CHECK(log.find("x slower than the median for the last ") != std::string::npos);
    const auto named = events_named(s.path("events." + std::to_string(node)), "straggler");
    REQUIRE_FALSE(named.empty());
    std::set<int> ranks;
    for (const auto& e : named) {
      for (const auto& r : e["ranks"]) ranks.insert(r.get<int>());
      CHECK(e["slowdown"].get<double>() >= 1.99);  // the factor, within rounding
    }
    CHECK(ranks == std::set<int>{3});  // nobody else
  }
}

TEST_CASE("stragglers: a job without one names nobody, its step times judged all the same") {
  ScratchDir s("stragglers_none");
  SystemPython python;
  CtrundDaemon daemon;
  auto agents = start_job(s, daemon.port(), "even", {});
  // The verdict is there (every rank has a rate), and empty.
  const Json steps = status_steps_until(
      s, daemon.port(), "even", [](const Json& v) { return v["ranks"].size() == 4; }, 20s);
  INFO(steps.dump());
  REQUIRE(steps.is_object());
  CHECK(steps["ranks"].size() == 4);
  CHECK(steps["stragglers"].empty());
  for (int node = 0; node < 2; ++node) REQUIRE(agents[node]->wait(90s) == 0);
  for (int node = 0; node < 2; ++node) {
    const std::string log = read_file(s.path("agent." + std::to_string(node) + ".log"));
    INFO(log);
    CHECK(log.find("slower than the median") == std::string::npos);
    CHECK(events_named(s.path("events." + std::to_string(node)), "straggler").empty());
  }
}

namespace {

// An event log's "time" ("2026-12-08T00:31:02.123Z") in epoch seconds.
double event_seconds(const Json& e) {
  std::tm tm{};
  const std::string text = e.value("time", "");
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!rest) return 0;
  return static_cast<double>(timegm(&tm)) + std::atof(rest);
}

struct SyncedRun {
  std::vector<std::vector<Json>> named;      // each node's "straggler" events
  std::vector<std::vector<Json>> recovered;  // each node's "straggler_recovered" events
  std::vector<std::string> logs;
  double slow_from = 0;  // when the slowdown began (the script's mark), epoch seconds
};

// Two agents of 2 workers, an unmodified synchronous DDP script (tests/python/ddp_sync_steps.py:
// no ctrun_worker) of `steps` steps with `script_flags`, or `program` itself where given;
// verdicts every second over 10 steps.
SyncedRun run_synced(const std::string& name, int steps,
                     const std::vector<std::string>& script_flags,
                     const std::vector<std::string>& agent_flags = {},
                     const std::vector<std::string>& program = {}) {
  ScratchDir s(name);
  SystemPython python;
  CtrundDaemon daemon;
  std::vector<std::string> script = {DDP_SYNC_SCRIPT_PATH, std::to_string(steps), "--mark",
                                     s.path("slow_from")};
  script.insert(script.end(), script_flags.begin(), script_flags.end());
  if (!program.empty()) script = program;
  auto agents = start_job(s, daemon.port(), name, agent_flags, script, "1");
  SyncedRun run;
  for (int node = 0; node < 2; ++node) {
    const auto code = agents[node]->wait(120s);
    run.logs.push_back(read_file(s.path("agent." + std::to_string(node) + ".log")));
    INFO(run.logs.back());
    REQUIRE(code == 0);
  }
  for (int node = 0; node < 2; ++node) {
    run.named.push_back(events_named(s.path("events." + std::to_string(node)), "straggler"));
    run.recovered.push_back(
        events_named(s.path("events." + std::to_string(node)), "straggler_recovered"));
  }
  run.slow_from = program.empty() ? std::atof(read_file(s.path("slow_from")).c_str()) : -1;
  return run;
}

// Every straggler event of every node names exactly `ranks`, the first (node 0's) within three
// intervals (3 s) of the slowdown's start, and each node later says they are back.
void check_named(const SyncedRun& run, const std::set<int>& ranks, const std::string& kind,
                 bool as_node = false) {
  INFO("node 0's log:\n" << run.logs[0] << "\nnode 1's log:\n" << run.logs[1]);
  for (int node = 0; node < 2; ++node) {
    INFO("node " << node);
    REQUIRE_FALSE(run.named[node].empty());
    std::set<int> named;
    for (const auto& e : run.named[node]) {
      INFO(e.dump());
      for (const auto& r : e["ranks"]) named.insert(r.get<int>());
      CHECK(e.value("holds_seconds", 0.0) > 0);  // at least a fifth of the step, by the rule
      CHECK(e.value("kind", "") == kind);
      CHECK(e.contains("straggler_node") == as_node);
    }
    CHECK(named == ranks);
    CHECK(run.logs[node].find(" holds every step for ") != std::string::npos);
    CHECK_FALSE(run.recovered[node].empty());  // back to the job's pace after the slowdown
  }
  if (run.slow_from < 0) return;  // a program that marks nothing
  REQUIRE(run.slow_from > 0);
  // Node 0's agent judges and says it first (agent 0 of the test is either node).
  const double named =
      std::min(event_seconds(run.named[0].front()), event_seconds(run.named[1].front()));
  CHECK(named - run.slow_from < 3.0);
}

}  // namespace

// The jobs users run synchronize every step: every rank's steps take the slowest's time, and the
// step rates alone name nobody. Each rank's own time (the step less what it waited for the
// others in DDP's all-reduces) names the one they wait for, with no change to the script.
TEST_CASE("stragglers: in synchronous DDP the rank slow in its data function is named",
          "[sync_ddp]") {
  const SyncedRun run =
      run_synced("sync_data", 140, {"--slow", "3", "--kind", "data", "--from", "20", "--to", "50"});
  check_named(run, {3}, "waiting for input");
}

TEST_CASE("stragglers: in synchronous DDP the rank slow in its own compute is named",
          "[sync_ddp]") {
  const SyncedRun run = run_synced(
      "sync_compute", 140, {"--slow", "1", "--kind", "compute", "--from", "20", "--to", "50"});
  check_named(run, {1}, "its own compute");
}

TEST_CASE(
    "stragglers: in synchronous DDP a rank stopped and continued (a straggler fault) is named",
    "[sync_ddp]") {
  // ctrun's own straggler fault: rank 2 runs 20% of each 200 ms from its 20th step for 4 s. The
  // script slows nobody itself (an empty range from step 20); rank 2 marks when step 20 begins.
  const SyncedRun run = run_synced(
      "sync_stopped", 140, {"--slow", "2", "--kind", "data", "--from", "20", "--to", "20"},
      {"--faults", "straggler:rank=2,at_step=20,duration=4,speed=0.2"});
  check_named(run, {2}, "not running: stopped");
}

TEST_CASE("stragglers: in synchronous DDP a whole slow node is named as the node", "[sync_ddp]") {
  const SyncedRun run = run_synced(
      "sync_node", 140, {"--slow", "node:1", "--kind", "data", "--from", "20", "--to", "50"});
  check_named(run, {2, 3}, "waiting for input", /*as_node=*/true);
  CHECK(run.logs[0].find("node 1 (") != std::string::npos);
}

TEST_CASE("stragglers: a clean synchronous DDP job names nobody, its 2 cores oversubscribed 2x",
          "[sync_ddp]") {
  // Four ranks on two cores, each computing its share: twice as many runnable as there are cores.
  const SyncedRun run = run_synced("sync_clean", 100, {"--base_ms", "0", "--work_ms", "40"});
  for (int node = 0; node < 2; ++node) {
    INFO(run.logs[node]);
    CHECK(run.named[node].empty());
  }
}

#ifdef MLP_PATH
TEST_CASE("stragglers: a C++ trainer's rank stopped and continued is named (ZeRO-2 over Gloo)",
          "[sync_ddp]") {
  // The seeds' MLP on libctrun_worker, sharded: its Gloo group times its waits for the peers.
  // 160 steps of about 50 ms; rank 1 runs 20% of each 200 ms from its 20th step for 4 s.
  const SyncedRun run = run_synced(
      "sync_cpp", 0, {}, {"--faults", "straggler:rank=1,at_step=20,duration=4,speed=0.2"},
      {MLP_PATH, "--zero", "2", "--samples", "40960", "--epochs", "1"});
  check_named(run, {1}, "not running: stopped");
}
#endif
