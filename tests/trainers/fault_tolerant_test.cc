// mlp --fault_tolerant under ctrun --fault_tolerance=step, as processes: a worker SIGKILLed or
// hung mid-step, an agent (a node) SIGKILLed. Each run asserts what per-step fault tolerance
// promises: the survivors keep their processes, no committed step is lost or redone, every sample
// of each epoch is trained exactly once (the --consumed_log), and every replica ends with the very
// same parameters.
#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kSamples = 1536;
constexpr std::uint64_t kEpochs = 2;

struct Commit {
  std::uint64_t epoch = 0;
  long long unix_ms = 0;
  std::vector<std::uint64_t> indices;
};

// replica -> step -> what it committed. A replica that committed one step twice fails the test.
std::map<std::string, std::map<std::int64_t, Commit>> read_consumed(const std::string& path) {
  std::map<std::string, std::map<std::int64_t, Commit>> out;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" fault ") != std::string::npos) continue;  // "<who> fault <unix ms> ..."
    std::istringstream fields(line);
    std::string replica;
    std::int64_t step = 0;
    long long pid = 0;
    Commit c;
    fields >> replica >> c.epoch >> step >> c.unix_ms >> pid;
    for (std::uint64_t i; fields >> i;) c.indices.push_back(i);
    INFO(line);
    CHECK(out[replica].count(step) == 0);
    out[replica][step] = std::move(c);
  }
  return out;
}

// The promises, from the log of every replica's commits.
void check_commits(const std::map<std::string, std::map<std::int64_t, Commit>>& commits,
                   const std::string& survivor, std::uint64_t samples = kSamples) {
  REQUIRE(commits.count(survivor));
  const auto& all = commits.at(survivor);
  // The survivor committed steps 1..N with none missing: nothing it committed was taken back.
  std::int64_t expected = 1;
  for (const auto& [step, c] : all) CHECK(step == expected++);
  // Every replica that committed a step committed the same samples for it.
  for (const auto& [replica, steps] : commits) {
    for (const auto& [step, c] : steps) {
      INFO(replica << " step " << step);
      REQUIRE(all.count(step));
      CHECK(all.at(step).indices == c.indices);
    }
  }
  std::map<std::uint64_t, std::multiset<std::uint64_t>> by_epoch;
  for (const auto& [step, c] : all) by_epoch[c.epoch].insert(c.indices.begin(), c.indices.end());
  REQUIRE(by_epoch.size() == kEpochs);
  for (const auto& [epoch, seen] : by_epoch) {
    INFO("epoch " << epoch);
    CHECK(seen.size() == samples);
    CHECK(std::set<std::uint64_t>(seen.begin(), seen.end()).size() == samples);
  }
}

// replica -> the pids its "training" lines (one per process started) and its digest lines name.
struct ReplicaLines {
  std::vector<std::string> started_pids;
  std::string final_pid;
  std::string digest;
};
std::map<std::string, ReplicaLines> replica_lines(const std::string& log) {
  std::map<std::string, ReplicaLines> out;
  const std::regex line(R"(\[([^\[\]\s]+) pid (\d+)\] (training|parameters digest) (\S+))");
  std::istringstream lines(log);
  for (std::string text; std::getline(lines, text);) {
    std::smatch m;
    if (!std::regex_search(text, m, line)) continue;
    auto& r = out[m[1]];
    if (m[3] == "training") {
      r.started_pids.push_back(m[2]);
    } else {
      r.final_pid = m[2];
      r.digest = m[4];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("trainers: with --fault_tolerant a killed or hung worker costs a step, not a restart") {
  ScratchDir s("mlp_ft");
  struct Fault {
    const char* name;
    const char* flag;
    const char* worker_timeout;
    const char* seen;
    const char* at_step;
    std::uint64_t samples;
  };
  // The kill early in a run of 256 steps, so that its replacement (seconds to start on a busy
  // machine) heals and trains on; the hang's replacement may come after the end.
  for (const Fault& f : {Fault{"killed", "--inject_kill_at_step", "--worker_timeout=0",
                               "was killed by SIGKILL", "3", 12288},
                         Fault{"hung", "--inject_hang_at_step", "--worker_timeout=8",
                               "no heartbeat for ", "10", kSamples}}) {
    const std::string consumed = s.path(std::string(f.name) + ".consumed");
    const std::string log = s.path(std::string(f.name) + ".log");
    std::vector<std::string> argv = {CTRUN_PATH,           "--standalone",
                                     "--nproc_per_node=3", "--fault_tolerance=step",
                                     "--max_restarts=2",   f.worker_timeout};
    argv.insert(argv.end(), {MLP_PATH, "--fault_tolerant", "--epochs", "2", "--samples",
                             std::to_string(f.samples), "--batch_size", "32", "--seed", "7"});
    argv.insert(argv.end(), {f.flag, f.at_step, "--consumed_log", consumed});
    argv.insert(argv.end(),
                {"--ft_collective_timeout_ms", "1000", "--ft_heartbeat_timeout_ms", "500",
                 "--ft_join_timeout_ms", "3000", "--ft_quorum_timeout_ms", "30000"});
    ChildProcess p(argv, log);
    const auto rc = p.wait(120s);
    const std::string out = read_file(log);
    INFO(out);
    REQUIRE(rc);
    CHECK(*rc == 0);
    CHECK(out.find(f.seen) != std::string::npos);
    CHECK(out.find("replacing worker rank 2 (local rank 2; 1 of 2 restarts); the others run on") !=
          std::string::npos);

    const auto lines = replica_lines(out);
    REQUIRE(lines.size() == 3);
    std::set<std::string> digests;
    for (const auto& [replica, r] : lines) {
      INFO(replica);
      // Survivors ran in one process from start to end; the faulty one was replaced once. Its
      // replacement heals and trains on, or, started after its peers finished (a hang is seen
      // only after --worker_timeout), learns that nothing is left.
      const bool faulty = replica.size() > 2 && replica.compare(replica.size() - 2, 2, "/2") == 0;
      CHECK(r.started_pids.size() == (faulty ? 2u : 1u));
      if (faulty && r.digest.empty()) {
        CHECK(out.find("the other replicas finished the training at step") != std::string::npos);
        continue;
      }
      digests.insert(r.digest);
      CHECK_FALSE(r.digest.empty());
      if (!faulty) CHECK(r.final_pid == r.started_pids.front());
    }
    CHECK(digests.size() == 1);  // the very same parameters on every replica
    const std::string survivor = lines.begin()->first;
    check_commits(read_consumed(consumed), survivor, f.samples);
    if (std::string(f.name) == "killed") CHECK(out.find("healed from ") != std::string::npos);
  }
}

TEST_CASE("trainers: with --fault_tolerant an agent SIGKILLed costs a step, the others go on") {
  ScratchDir s("mlp_ft_agents");
  const std::string consumed = s.path("consumed");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto agent = [&](const std::string& name) {
    std::vector<std::string> argv = {CTRUN_PATH,
                                     "--nnodes=2:3",
                                     "--nproc_per_node=1",
                                     "--rdzv_backend=c10d",
                                     "--rdzv_endpoint=" + endpoint,
                                     "--rdzv_id=ft-agents",
                                     "--fault_tolerance=step",
                                     "--max_restarts=0"};
    argv.insert(argv.end(), {MLP_PATH, "--fault_tolerant", "--epochs", "2", "--samples", "6144",
                             "--batch_size", "32", "--seed", "7", "--consumed_log", consumed});
    argv.insert(argv.end(),
                {"--ft_collective_timeout_ms", "1000", "--ft_heartbeat_timeout_ms", "500",
                 "--ft_join_timeout_ms", "3000", "--ft_quorum_timeout_ms", "30000"});
    return std::make_unique<ChildProcess>(argv, s.path(name + ".log"));
  };
  // a hosts the rendezvous; c, which does not, is the one killed.
  auto a = agent("a");
  REQUIRE(wait_for_text(s.path("a.log"), "hosting the rendezvous", 30s));
  auto b = agent("b");
  auto c = agent("c");
  auto commits_so_far = [&] {
    const std::string text = read_file(consumed);
    return std::count(text.begin(), text.end(), '\n');
  };
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (commits_so_far() < 3 * 20 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(commits_so_far() >= 3 * 20);  // 20 steps committed by each of the three replicas
  c->signal(SIGKILL);
  const auto c_code = c->wait(30s);
  const auto a_code = a->wait(120s);
  const auto b_code = b->wait(60s);
  const std::string out_a = read_file(s.path("a.log"));
  const std::string out_b = read_file(s.path("b.log"));
  INFO(out_a << "\n---- b ----\n" << out_b);
  REQUIRE(c_code);
  CHECK(*c_code == 128 + SIGKILL);
  REQUIRE(a_code);
  REQUIRE(b_code);
  CHECK(*a_code == 0);
  CHECK(*b_code == 0);
  // The survivors' workers ran in one process each from start to end, to the same parameters.
  const auto lines_a = replica_lines(out_a);
  const auto lines_b = replica_lines(out_b);
  REQUIRE(lines_a.size() == 1);
  REQUIRE(lines_b.size() == 1);
  for (const auto* lines : {&lines_a, &lines_b}) {
    const auto& r = lines->begin()->second;
    CHECK(r.started_pids.size() == 1);
    CHECK(r.final_pid == r.started_pids.front());
  }
  CHECK_FALSE(lines_a.begin()->second.digest.empty());
  CHECK(lines_a.begin()->second.digest == lines_b.begin()->second.digest);
  check_commits(read_consumed(consumed), lines_a.begin()->first, 6144);
}
