// Stragglers found while a job runs: two agents on a ctrund, four Python workers reporting
// their steps through ctrun_worker; a straggler injected by --faults is named by both agents
// (a line, an event) and in `ctrun status`, and a job without one names nobody.
#include <chrono>
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

// Two agents of job `job` (2 workers each) on the daemon, each worker 160 steps of 50 ms; the
// step times judged over 10 steps every 0.5 s.
std::vector<std::unique_ptr<ChildProcess>> start_job(const ScratchDir& s, std::uint16_t port,
                                                     const std::string& job,
                                                     const std::vector<std::string>& extra) {
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
                                     "--straggler_interval=0.5",
                                     "--event_log",
                                     s.path("events." + std::to_string(node))};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {REPORT_STEPS_SCRIPT_PATH, "160", s.path("step")});
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
