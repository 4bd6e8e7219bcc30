#include "launcher/commands/status_view.h"

#include "catch.h"
#include "launcher/diagnosis/stragglers.h"

using namespace ctrun::launcher;
using Json = ctrun::rendezvous::Json;

TEST_CASE("status view: faults injected on purpose are counted and the last one named") {
  const Json answer{{"job", "j"},       {"restarts", 2}, {"faults_injected", 3},
                    {"connections", 1}, {"keys", 4},     {"rendezvous", nullptr}};
  const Json last{{"what", "fault 3: SIGKILL to rank 1 at step 40"},
                  {"time", "2026-11-26T22:00:00.000Z"},
                  {"node", "n1"},
                  {"injected", true}};
  const JobStatus job{answer, 5, last, Json()};
  const Json j = job_status_json(job);
  CHECK(j["faults_injected"] == 3);
  CHECK(j["last_fault"] == last);
  CHECK(j["restarts_left"] == 3);
  CHECK(job_status_table(job) ==
        "job j: store, restarts 2 of 5 (3 left)\n"
        "faults injected on purpose: 3; last: fault 3: SIGKILL to rank 1 at step 40 "
        "(2026-11-26T22:00:00.000Z, node n1)\n");
  // None: no line, and null in JSON.
  const JobStatus clean{Json{{"job", "j"}, {"restarts", 0}, {"rendezvous", nullptr}}, -1, Json(),
                        Json()};
  CHECK(job_status_json(clean)["faults_injected"] == 0);
  CHECK(job_status_json(clean)["last_fault"].is_null());
  CHECK(job_status_table(clean) == "job j: store, restarts 0\n");
}

namespace {

// A running job of `nodes` nodes with `per_node` ranks each, rank 5 three times slower.
JobStatus job_with_steps(int nodes, int per_node) {
  Json members = Json::array();
  std::vector<RankRate> ranks;
  for (int n = 0; n < nodes; ++n) {
    members.push_back({{"node", "n" + std::to_string(n)},
                       {"host", "h" + std::to_string(n)},
                       {"group_rank", n},
                       {"local_world_size", per_node},
                       {"place", "member"},
                       {"last_seen_ms_ago", 100}});
    for (int l = 0; l < per_node; ++l) {
      const int rank = n * per_node + l;
      ranks.push_back({rank, n, "h" + std::to_string(n), 40, rank == 5 ? 0.3 : 0.1, 30});
    }
  }
  const Json rdzv{{"state", "running"}, {"round", 2},         {"formed", true},
                  {"min_nodes", nodes}, {"max_nodes", nodes}, {"nodes", members}};
  return JobStatus{Json{{"job", "j"}, {"restarts", 0}, {"rendezvous", rdzv}}, -1, Json(),
                   step_verdict_json(judge_steps(ranks, 2.0, 2))};
}

}  // namespace

TEST_CASE("status view: each rank's step time, the stragglers marked, past 64 ranks only them") {
  const JobStatus small = job_with_steps(2, 4);
  const Json j = job_status_json(small);
  REQUIRE(j["steps"].is_object());
  CHECK(j["steps"]["stragglers"] == Json::array({5}));
  CHECK(j["steps"]["ranks"].size() == 8);
  const std::string table = job_status_table(small);
  CHECK(table.find("step times (round 2, median 0.100 s/step, a straggler at 2x): 1 straggler\n"
                   "RANK  GROUP_RANK  HOST  STEP  S_PER_STEP  X_MEDIAN\n"
                   "0     0           h0    40    0.100       1.00\n") != std::string::npos);
  CHECK(table.find("5     1           h1    40    0.300       3.00      straggler\n") !=
        std::string::npos);

  const std::string big = job_status_table(job_with_steps(17, 4));  // 68 ranks
  CHECK(big.find("5     1           h1    40    0.300       3.00      straggler\n") !=
        std::string::npos);
  CHECK(big.find("\n0     0") == std::string::npos);
  CHECK(big.find("(67 more ranks at the job's pace: --json lists them)\n") != std::string::npos);

  // No verdict (no steps reported): no section, and null in JSON.
  JobStatus none = small;
  none.steps = Json();
  CHECK(job_status_json(none)["steps"].is_null());
  CHECK(job_status_table(none).find("step times") == std::string::npos);
}

TEST_CASE("status view: in a synchronous job each rank's own time, what it holds and on what") {
  std::vector<RankRate> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    RankRate r{rank, rank / 2, "h" + std::to_string(rank / 2), 40, 0.25, 30};
    r.own_seconds_per_step = rank == 3 ? 0.24 : 0.03;
    r.wait_seconds_per_step = rank == 3 ? 0.01 : 0.22;
    r.kind = rank == 3 ? "waiting for input" : "its own compute";
    ranks.push_back(r);
  }
  JobStatus job = job_with_steps(2, 2);
  job.steps = step_verdict_json(judge_steps(ranks, 2.0, 1));
  const std::string table = job_status_table(job);
  INFO(table);
  CHECK(table.find("RANK  GROUP_RANK  HOST  STEP  S_PER_STEP  OWN_S  HOLDS_S  X_MEDIAN  KIND") !=
        std::string::npos);
  CHECK(table.find("3     1           h1    40    0.250       0.240  0.210    8.00      waiting "
                   "for input  straggler\n") != std::string::npos);
  CHECK(job_status_json(job)["steps"]["stragglers"] == Json::array({3}));
}
