#include "ft_checks.h"

#include <algorithm>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "catch.h"
#include "process.h"

namespace ctrun::testing {

Commits read_consumed(const std::string& path) {
  Commits out;
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

void check_commits(const Commits& commits, std::uint64_t samples, std::uint64_t epochs) {
  // Every replica that committed a step committed the same samples for it. (A replica may miss
  // one: on Gloo, one whose last receive of a step failed after its peers' succeeded does not
  // commit it, and heals it from them instead.)
  std::map<std::int64_t, Commit> all;
  for (const auto& [replica, steps] : commits) {
    for (const auto& [step, c] : steps) {
      INFO(replica << " step " << step);
      auto [it, first] = all.emplace(step, c);
      if (!first) CHECK(it->second.indices == c.indices);
    }
  }
  // Steps 1..N were committed with none missing: nothing committed was taken back.
  std::int64_t expected = 1;
  for (const auto& [step, c] : all) CHECK(step == expected++);
  std::map<std::uint64_t, std::multiset<std::uint64_t>> by_epoch;
  for (const auto& [step, c] : all) by_epoch[c.epoch].insert(c.indices.begin(), c.indices.end());
  REQUIRE(by_epoch.size() == epochs);
  for (const auto& [epoch, seen] : by_epoch) {
    INFO("epoch " << epoch);
    CHECK(seen.size() == samples);
    CHECK(std::set<std::uint64_t>(seen.begin(), seen.end()).size() == samples);
  }
}

std::string without_step_lines(const std::string& log) {
  const std::regex step_line(R"(\] step \d+ loss )");
  std::string out;
  std::istringstream lines(log);
  for (std::string text; std::getline(lines, text);) {
    if (!std::regex_search(text, step_line)) out += text + "\n";
  }
  return out;
}

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

void check_replaced_worker(const std::string& out, std::size_t workers, int faulty) {
  const auto lines = replica_lines(out);
  REQUIRE(lines.size() == workers);
  const std::string suffix = "/" + std::to_string(faulty);
  std::set<std::string> digests;
  for (const auto& [replica, r] : lines) {
    INFO(replica);
    const bool replaced =
        replica.size() > suffix.size() &&
        replica.compare(replica.size() - suffix.size(), suffix.size(), suffix) == 0;
    CHECK(r.started_pids.size() == (replaced ? 2u : 1u));
    if (replaced && r.digest.empty()) {
      CHECK(out.find("the other replicas finished the training at step") != std::string::npos);
      continue;
    }
    digests.insert(r.digest);
    CHECK_FALSE(r.digest.empty());
    if (!replaced) CHECK(r.final_pid == r.started_pids.front());
  }
  CHECK(digests.size() == 1);  // the very same parameters on every replica
}

void check_node_joined(const std::string& out_a, const std::string& out_b, const std::string& out_c,
                       const std::string& consumed, std::uint64_t samples) {
  // The first two took the new node in without stopping their workers (no restart counted).
  for (const std::string* out : {&out_a, &out_b}) {
    CHECK(out->find("joining it; the workers run on") != std::string::npos);
    CHECK(out->find("restarting") == std::string::npos);
  }
  // The newcomer healed from a peer, then trained with them to the same parameters.
  CHECK(out_c.find("healed from ") != std::string::npos);
  std::map<std::string, ReplicaLines> lines;
  for (const std::string* out : {&out_a, &out_b, &out_c}) {
    const auto one = replica_lines(*out);
    REQUIRE(one.size() == 1);
    lines.insert(one.begin(), one.end());
  }
  REQUIRE(lines.size() == 3);
  check_kept_processes(lines);
  const auto commits = read_consumed(consumed);
  CHECK(commits.size() == 3);  // the newcomer committed steps too
  check_commits(commits, samples);
}

std::size_t check_fault_tolerant_report(const std::string& path) {
  const auto report = nlohmann::json::parse(read_file(path));
  CHECK(report["outcome"] == "succeeded");
  std::set<std::string> digests;
  for (const auto& [rank, digest] : report["results"].items()) digests.insert(digest);
  CHECK(digests.size() == 1);  // the very same parameters on every replica
  for (const auto& f : report["faults"]) {
    INFO(f.dump());
    // A replaced worker heals from its peers' committed step: nothing is trained twice.
    if (f.contains("steps_redone")) CHECK(f["steps_redone"] == 0);
  }
  return report["results"].size();
}

std::vector<std::string> ft_mlp_argv(const std::string& mlp_path, std::uint64_t samples,
                                     const std::string& consumed, long quorum_timeout_ms) {
  return {mlp_path,
          "--fault_tolerant",
          "--epochs",
          "2",
          "--samples",
          std::to_string(samples),
          "--batch_size",
          "32",
          "--seed",
          "7",
          "--consumed_log",
          consumed,
          "--ft_collective_timeout_ms",
          "1000",
          "--ft_heartbeat_timeout_ms",
          "500",
          "--ft_join_timeout_ms",
          "3000",
          "--ft_quorum_timeout_ms",
          std::to_string(quorum_timeout_ms)};
}

std::vector<std::string> ft_agent_argv(const std::string& ctrun_path, const std::string& nnodes,
                                       const std::string& endpoint, const std::string& rdzv_id,
                                       const std::string& conf,
                                       const std::vector<std::string>& worker) {
  std::vector<std::string> argv = {ctrun_path,
                                   "--nnodes=" + nnodes,
                                   "--nproc_per_node=1",
                                   "--rdzv_backend=c10d",
                                   "--rdzv_endpoint=" + endpoint,
                                   "--rdzv_id=" + rdzv_id,
                                   "--fault_tolerance=step",
                                   "--max_restarts=0"};
  if (!conf.empty()) argv.push_back("--rdzv_conf=" + conf);
  argv.insert(argv.end(), worker.begin(), worker.end());
  return argv;
}

long long unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

long lines_in(const std::string& path) {
  const std::string text = read_file(path);
  return static_cast<long>(std::count(text.begin(), text.end(), '\n'));
}

bool wait_for_lines(const std::string& path, long lines, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (lines_in(path) < lines && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return lines_in(path) >= lines;
}

void check_kept_processes(const std::map<std::string, ReplicaLines>& lines) {
  std::set<std::string> digests;
  for (const auto& [replica, r] : lines) {
    INFO(replica);
    CHECK(r.started_pids.size() == 1);
    CHECK(r.final_pid == r.started_pids.front());
    CHECK_FALSE(r.digest.empty());
    digests.insert(r.digest);
  }
  CHECK(digests.size() == 1);
}

}  // namespace ctrun::testing
