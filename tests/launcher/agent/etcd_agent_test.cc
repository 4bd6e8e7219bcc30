// ctrun --rdzv_backend=etcd end to end: real agents, real workers, a real etcd (Debian's
// etcd-server) on loopback ports, stopped and restarted under the job.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch.h"
#include "etcd_server.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// One agent on etcd: `nnodes` nodes of `workers` test workers each; keep-alives every 1 s, a
// lease of 2 s.
std::unique_ptr<ChildProcess> start_node(const ScratchDir& s, const std::string& endpoints,
                                         const std::string& run_id, const std::string& nnodes,
                                         int workers, const std::vector<std::string>& worker_args,
                                         const std::string& log,
                                         const std::string& backend = "etcd",
                                         const std::vector<std::string>& flags = {}) {
  std::vector<std::string> argv = {CTRUN_PATH,
                                   "--nnodes=" + nnodes,
                                   "--nproc_per_node=" + std::to_string(workers),
                                   "--rdzv_backend=" + backend,
                                   "--rdzv_endpoint=" + endpoints,
                                   "--rdzv_id=" + run_id,
                                   "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2,"
                                   "last_call_timeout=60",
                                   "--max_restarts=3",
                                   "--shutdown_timeout=2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(TEST_WORKER_PATH);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(argv, s.path(log));
}

bool wait_exists(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return std::filesystem::exists(path);
}

// Both agents exit 0, and the four ranks wrote their torchrun variables under `prefix`.
void expect_four_ranks(const ScratchDir& s, ChildProcess& a, ChildProcess& b,
                       const std::string& prefix, const std::string& run_id) {
  auto code_a = a.wait(60s);
  auto code_b = b.wait(60s);
  INFO(read_file(s.path("a.log")) + read_file(s.path("b.log")));
  REQUIRE(code_a.has_value());
  REQUIRE(code_b.has_value());
  CHECK(*code_a == 0);
  CHECK(*code_b == 0);
  std::set<std::string> masters;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = read_env_file(s.path(prefix + "." + std::to_string(rank)));
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["WORLD_SIZE"] == "4");
    CHECK(env["GROUP_RANK"] == std::to_string(rank / 2));
    CHECK(env["TORCHELASTIC_RUN_ID"] == run_id);
    // C++ workers meet in the job's etcd keys, Python ones at MASTER_ADDR:MASTER_PORT.
    CHECK(env["CTRUN_STORE_BACKEND"] == "etcd");
    CHECK(env["CTRUN_STORE_ADDR"].find("127.0.0.1:") == 0);
    CHECK(env["CTRUN_STORE_PORT"] == "<unset>");
    CHECK(env["CTRUN_STORE_PREFIX"].find("rdzv/") == 0);
    masters.insert(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]);
  }
  CHECK(masters.size() == 1);
}

// Two nodes of two workers that sleep `seconds`, then write their variables to env.<RANK>;
// returns once the round has formed on both.
std::pair<std::unique_ptr<ChildProcess>, std::unique_ptr<ChildProcess>> start_sleeping_pair(
    const ScratchDir& s, const std::string& endpoints, const std::string& run_id,
    const std::string& seconds) {
  ::setenv("CTRUN_TEST_OUT", s.path("env").c_str(), 1);
  auto a = start_node(s, endpoints, run_id, "2", 2, {"sleep", seconds}, "a.log");
  auto b = start_node(s, endpoints, run_id, "2", 2, {"sleep", seconds}, "b.log");
  ::unsetenv("CTRUN_TEST_OUT");
  REQUIRE(wait_for_text(s.path("a.log"), "round 0: group rank", 30s));
  REQUIRE(wait_for_text(s.path("b.log"), "round 0: group rank", 30s));
  return {std::move(a), std::move(b)};
}

// No worker of the job was ever restarted.
void expect_no_restart(const ScratchDir& s) {
  for (int rank = 0; rank < 4; ++rank) {
    auto env = read_env_file(s.path("env." + std::to_string(rank)));
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
  }
}

}  // namespace

TEST_CASE("etcd: two nodes of two workers, a worker fails once, the job restarts and succeeds") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_agent");
  EtcdCluster etcd(s, 1);
  auto a =
      start_node(s, etcd.endpoints(), "etcd-two", "2", 2, {"fail_once", s.path("env")}, "a.log");
  auto b = start_node(s, etcd.endpoints(), "etcd-two", "2", 2, {"fail_once", s.path("env")},
                      "b.log", "etcd-v2");
  expect_four_ranks(s, *a, *b, "env", "etcd-two");
  const std::string logs = read_file(s.path("a.log")) + read_file(s.path("b.log"));
  CHECK(logs.find("restarting the job (1 of 3 restarts)") != std::string::npos);
  CHECK(logs.find("round 1: group rank") != std::string::npos);
}

TEST_CASE("etcd: a SIGKILLed agent's lease expires and the survivor re-forms alone") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_agent");
  EtcdCluster etcd(s, 1);
  auto node = [&](const std::string& log, const std::vector<std::string>& flags) {
    return start_node(s, etcd.endpoints(), "etcd-kill", "1:2", 1, {"until_alone", s.path("pids")},
                      log, "etcd", flags);
  };
  auto victim = node("victim.log", {});
  auto survivor = node("survivor.log", {"--event_log=" + s.path("events.jsonl")});
  REQUIRE(wait_exists(s.path("pids.0"), 30s));
  REQUIRE(wait_exists(s.path("pids.1"), 30s));
  victim->signal(SIGKILL);
  REQUIRE(victim->wait(5s).has_value());
  const auto killed = std::chrono::steady_clock::now();
  // The lease (2 s) runs out, the survivor removes the node and forms round 1 by itself.
  REQUIRE(wait_for_text(s.path("survivor.log"), "round 1: group rank 0 of 1", 15s));
  const auto took = std::chrono::steady_clock::now() - killed;
  CHECK(took >= 1500ms);  // not before the lease could expire
  auto code = survivor->wait(20s);
  const std::string log = read_file(s.path("survivor.log"));
  INFO(log);
  CHECK(log.find("its etcd lease expired") != std::string::npos);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // The survivor's event log tells it: the rendezvous (run by whichever agent wrote the change,
  // here the survivor) lost the victim, and the agent ran a second round.
  const std::string events = read_file(s.path("events.jsonl"));
  INFO(events);
  int lost = 0;
  int rounds = 0;
  std::istringstream lines(events);
  for (std::string line; std::getline(lines, line);) {
    const auto e = nlohmann::json::parse(line);
    if (e.at("event") == "node_lost") {
      ++lost;
      CHECK(e.at("source") == "ctrun rendezvous");
      CHECK(e.at("reason").get<std::string>().find("etcd lease expired") != std::string::npos);
    }
    if (e.at("event") == "round" && e.at("source") == "ctrun") ++rounds;
  }
  CHECK(lost == 1);
  CHECK(rounds == 2);
}

TEST_CASE("etcd: etcd SIGKILLed and restarted mid-job, the job goes on") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_agent");
  EtcdCluster etcd(s, 1);
  auto [a, b] = start_sleeping_pair(s, etcd.endpoints(), "etcd-restart", "6");
  std::this_thread::sleep_for(500ms);
  etcd.kill(0);
  std::this_thread::sleep_for(1s);
  etcd.start(0);
  expect_four_ranks(s, *a, *b, "env", "etcd-restart");
  expect_no_restart(s);
}

TEST_CASE("etcd: a three-member cluster loses the member the agents talk to, the job goes on") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_agent");
  EtcdCluster etcd(s, 3);
  auto [a, b] = start_sleeping_pair(s, etcd.endpoints(), "etcd-three", "5");
  etcd.kill(0);  // the first endpoint of --rdzv_endpoint
  expect_four_ranks(s, *a, *b, "env", "etcd-three");
  expect_no_restart(s);
}

TEST_CASE("etcd: ctrun status shows a job on etcd as JSON and a table, and lists jobs") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_agent");
  EtcdCluster etcd(s, 1);
  const std::string job_id = "team/run-1";  // a '/' in the id stays inside its own keys
  auto [a, b] = start_sleeping_pair(s, etcd.endpoints(), job_id, "30");
  auto status = [&](std::vector<std::string> args, const std::string& out) {
    args.insert(args.begin(), {CTRUN_PATH, "status", "--rdzv_backend=etcd",
                               "--rdzv_endpoint=" + etcd.endpoints()});
    ChildProcess p(args, s.path(out));
    return p.wait(20s);
  };
  REQUIRE(status({"--rdzv_id=" + job_id, "--json"}, "status.json") == 0);
  const std::string text = read_file(s.path("status.json"));
  INFO(text);
  auto job = nlohmann::json::parse(text);
  CHECK(job["job"] == job_id);
  CHECK(job["state"] == "running");
  CHECK(job["formed"] == true);
  CHECK(job["restarts"] == 0);
  CHECK(job["max_restarts"] == 3);
  CHECK(job["connections"] == 2);
  REQUIRE(job["nodes"].size() == 2);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(job["nodes"][rank]["group_rank"] == rank);
    CHECK(job["nodes"][rank]["host"] == "127.0.0.1");
    const double age = job["nodes"][rank]["last_heartbeat_age_s"].get<double>();
    CHECK(age >= 0);
    CHECK(age <= 2);  // the lease (2 s) is renewed at least three times per TTL
  }
  CHECK(job["steps"].is_null());  // the workers report no steps: no straggler verdict
  REQUIRE(status({"--rdzv_id=" + job_id}, "status.txt") == 0);
  CHECK(read_file(s.path("status.txt"))
            .find("job team/run-1: running, round 0 (formed), nodes 2 (min 2, max 2), restarts 0 "
                  "of 3 (3 left)") != std::string::npos);
  // A verdict as node 0's agent sets it in the job's store: shown from etcd as from ctrund.
  {
    ChildProcess put({"/usr/bin/etcdctl", "--endpoints=" + etcd.urls(), "put",
                      "/ctrun/team%2Frun-1/store/ctrun/stragglers",
                      R"({"round": 0, "factor": 2, "median_seconds_per_step": 0.1,)"
                      R"( "stragglers": [1], "ranks": [{"rank": 0, "seconds_per_step": 0.1},)"
                      R"( {"rank": 1, "seconds_per_step": 0.3}]})"},
                     s.path("put.log"));
    REQUIRE(put.wait(20s) == 0);
  }
  REQUIRE(status({"--rdzv_id=" + job_id, "--json"}, "steps.json") == 0);
  const auto with_steps = nlohmann::json::parse(read_file(s.path("steps.json")));
  INFO(with_steps.dump());
  CHECK(with_steps["steps"]["stragglers"] == nlohmann::json::array({1}));
  CHECK(with_steps["steps"]["ranks"].size() == 2);
  REQUIRE(status({}, "jobs.txt") == 0);
  CHECK(read_file(s.path("jobs.txt")).find("team/run-1") != std::string::npos);
  CHECK(status({"--rdzv_id=team"}, "none.txt") == 1);
  CHECK(read_file(s.path("none.txt")).find("no job 'team'") != std::string::npos);
  a->signal(SIGTERM);
  b->signal(SIGTERM);
  CHECK(a->wait(20s).has_value());
  CHECK(b->wait(20s).has_value());

  // A job that succeeded, then a new job under its id: it starts afresh (the old store wiped
  // in the same write), and the new job's restart budget is there again.
  auto [done_a, done_b] = start_sleeping_pair(s, etcd.endpoints(), "again", "0");
  CHECK(done_a->wait(20s) == 0);
  CHECK(done_b->wait(20s) == 0);
  auto [c, d] = start_sleeping_pair(s, etcd.endpoints(), "again", "30");
  nlohmann::json again;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  int asked = 0;
  // Ask until the new job has formed and its agents have set its budget again (forming it
  // deleted the old job's store, budget included; each agent writes it back after its join).
  do {
    const std::string out = "again" + std::to_string(asked++) + ".json";
    REQUIRE(status({"--rdzv_id=again", "--json"}, out) == 0);
    again = nlohmann::json::parse(read_file(s.path(out)));
  } while (!(again["state"] == "running" && again["formed"] == true &&
             !again["max_restarts"].is_null()) &&
           std::chrono::steady_clock::now() < deadline);
  INFO(again.dump(2));
  CHECK(again["state"] == "running");
  CHECK(again["formed"] == true);
  CHECK(again["round"] == 0);
  CHECK(again["restarts"] == 0);
  CHECK(again["max_restarts"] == 3);
  c->signal(SIGTERM);
  d->signal(SIGTERM);
  CHECK(c->wait(20s).has_value());
  CHECK(d->wait(20s).has_value());
}

TEST_CASE("etcd: a bad endpoint list is a one-line error") {
  ScratchDir s("etcd_agent");
  ChildProcess c({CTRUN_PATH, "--nnodes=1", "--rdzv_backend=etcd", "--rdzv_endpoint=h1:2379,",
                  TEST_WORKER_PATH, "exit", "0"},
                 s.path("bad.log"));
  auto code = c.wait(10s);
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(read_file(s.path("bad.log")).find("--rdzv_endpoint: empty etcd endpoint in 'h1:2379,'") !=
        std::string::npos);
}
