// Real multi-node jobs on one machine: hosts are network namespaces from
// scripts/netns-cluster.sh (each test makes its own, with a unique prefix, and removes it). A
// daemon in node0, one agent per node started by address as on a cluster, `mlp` training over
// Gloo across the namespaces. Needs root; elsewhere the tests say so and check nothing.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "catch.h"
#include "ft_checks.h"
#include "netns_cluster.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
using Json = nlohmann::json;

namespace {

bool root() { return geteuid() == 0; }

// ctrund in node `node` (0 unless given), on its address and port 29400 as a user would start
// it; listening on return.
std::unique_ptr<ChildProcess> start_daemon(const Cluster& cluster, const ScratchDir& s,
                                           int node = 0) {
  auto daemon = std::make_unique<ChildProcess>(
      cluster.on(node, {CTRUND_PATH, "--host", Cluster::address(node), "--port", "29400",
                        "--port_file", s.path("port")}),
      s.path("ctrund.log"));
  REQUIRE(wait_for_file(s.path("port"), 10s));
  return daemon;
}

// The number after the last "step " in a trainer's log ("step 40 loss ..."), or -1.
int last_logged_step(const std::string& log) {
  int step = -1;
  for (std::size_t at = log.find("]:step "); at != std::string::npos;
       at = log.find("]:step ", at + 1)) {
    step = std::atoi(log.c_str() + at + 7);
  }
  return step;
}

// How long after `since` the file at `path` came to contain `text` (polled, bounded), or nullopt.
std::optional<std::chrono::milliseconds> time_until_text(
    const std::string& path, const std::string& text, std::chrono::steady_clock::time_point since,
    std::chrono::seconds timeout) {
  if (!wait_for_text(path, text, timeout)) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               since);
}

// Every log of the job's agents, in one string.
std::string all_logs(const ScratchDir& s, int nodes) {
  std::string out;
  for (int i = 0; i < nodes; ++i) out += read_file(s.path("node" + std::to_string(i) + ".log"));
  return out;
}

// How long after `since` `what` came to appear `times` times in the files (polled every 20 ms,
// bounded), or nullopt.
std::optional<std::chrono::milliseconds> time_until_count(
    const std::function<std::string()>& read, const std::string& what, std::size_t times,
    std::chrono::steady_clock::time_point since, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (count_of(read(), what) >= times) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - since);
    }
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

// The time of day, in ms, of the agent's line holding `text` ("2026-11-27T01:29:47.638Z ctrun:
// ..."), or nullopt.
std::optional<long> stamp_ms(const std::string& log, const std::string& text) {
  const auto at = log.find(text);
  if (at == std::string::npos) return std::nullopt;
  const auto line = log.rfind('\n', at);
  const std::string stamp = log.substr(line == std::string::npos ? 0 : line + 1, 24);
  if (stamp.size() < 23 || stamp[10] != 'T') return std::nullopt;
  return ((std::atol(stamp.c_str() + 11) * 60 + std::atol(stamp.c_str() + 14)) * 60 +
          std::atol(stamp.c_str() + 17)) *
             1000 +
         std::atol(stamp.c_str() + 20);
}

// The step after the last "resumed at step " in `log`, or -1.
int last_resumed_step(const std::string& log) {
  const auto at = log.rfind("resumed at step ");
  return at == std::string::npos ? -1 : std::atoi(log.c_str() + at + 16);
}

// The highest `value` of any node's log. The node whose worker logs steps (group rank 0) may
// change when a round re-forms, and the logs of nodes that left stay behind with older numbers,
// so neither the last line of one log nor of all of them put together is the job's progress.
int highest(const ScratchDir& s, int nodes, int (*value)(const std::string&)) {
  int best = -1;
  for (int i = 0; i < nodes; ++i) {
    best = std::max(best, value(read_file(s.path("node" + std::to_string(i) + ".log"))));
  }
  return best;
}

// One agent per namespace host of a 2:3 --fault_tolerance=step job, each with one `mlp
// --fault_tolerant` worker (`quorum_timeout_ms`), on the c10d rendezvous of the daemon in node 0;
// keep-alives every second, two may be missed (`extra_conf` adds to --rdzv_conf). Node i logs to
// DIR/node<i>.log.
std::vector<std::unique_ptr<ChildProcess>> start_ft_agents(
    const Cluster& cluster, const ScratchDir& s, int nodes, std::uint64_t samples,
    const std::string& consumed, long quorum_timeout_ms, const std::string& extra_conf = "") {
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < nodes; ++i) {
    const auto argv = ft_agent_argv(
        CTRUN_PATH, "2:" + std::to_string(nodes), Cluster::address(0) + ":29400", "job",
        "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=1" +
            extra_conf,
        ft_mlp_argv(MLP_PATH, samples, consumed, quorum_timeout_ms));
    agents.push_back(std::make_unique<ChildProcess>(cluster.on(i, argv),
                                                    s.path("node" + std::to_string(i) + ".log")));
  }
  return agents;
}

}  // namespace

TEST_CASE("cluster: mlp trains across 2 and 3 namespace hosts, started by address") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  for (int nodes : {2, 3}) {
    INFO(nodes << " nodes");
    Cluster cluster(nodes);
    INFO(cluster.setup_log());
    REQUIRE(cluster.ok());
    ScratchDir s("cluster_mlp");
    const std::string endpoint = Cluster::address(0) + ":29400";
    auto daemon = start_daemon(cluster, s);
    std::vector<std::unique_ptr<ChildProcess>> agents;
    for (int i = 0; i < nodes; ++i) {
      agents.push_back(std::make_unique<ChildProcess>(
          cluster.on(i, {CTRUN_PATH, "--nnodes=" + std::to_string(nodes), "--nproc_per_node=2",
                         "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint, "--rdzv_id=job",
                         "--rdzv_conf=is_host=false", MLP_PATH, "--epochs", "1", "--samples",
                         "1536", "--seed", "3"}),
          s.path("node" + std::to_string(i) + ".log")));
    }
    for (int i = 0; i < nodes; ++i) {
      INFO("node " << i << ":\n" << read_file(s.path("node" + std::to_string(i) + ".log")));
      CHECK(agents[i]->wait(180s) == 0);
    }
    // The daemon picks which node is group rank 0; its rank-0 worker prints the replica check,
    // and every node's workers got its namespace address as MASTER_ADDR (not loopback).
    INFO("ctrund:\n" << read_file(s.path("ctrund.log")));
    std::vector<int> reporting;
    for (int i = 0; i < nodes; ++i) {
      const std::string log = read_file(s.path("node" + std::to_string(i) + ".log"));
      if (log.find("parameters identical on all " + std::to_string(2 * nodes) + " rank(s)") !=
          std::string::npos) {
        reporting.push_back(i);
      }
    }
    REQUIRE(reporting.size() == 1);
    for (int i = 0; i < nodes; ++i) {
      const std::string log = read_file(s.path("node" + std::to_string(i) + ".log"));
      CHECK(log.find("master " + Cluster::address(reporting[0]) + ":") != std::string::npos);
    }
    daemon->signal(SIGTERM);
    CHECK(daemon->wait(10s) == 0);
  }
}

TEST_CASE(
    "cluster: a node's link goes down and comes back, the job shrinks, resumes, and grows again") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  Cluster cluster(2);
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_link");
  auto daemon = start_daemon(cluster, s);
  // A 1:2 job: one node is enough to go on. Keep-alives every second, two may be missed. The
  // checkpoint directory is shared, as on a cluster with a shared filesystem.
  const int checkpoint_every = 10;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        cluster.on(i, {CTRUN_PATH, "--nnodes=1:2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=" + Cluster::address(0) + ":29400", "--rdzv_id=job",
                       "--rdzv_conf=is_host=false,keep_alive_interval=1,keep_alive_max_attempt=2,"
                       "last_call_timeout=1",
                       "--max_restarts=3", MLP_PATH, "--epochs", "12", "--samples", "4096",
                       "--checkpoint_dir", s.path("ckpt"), "--checkpoint_every",
                       std::to_string(checkpoint_every), "--log_every", "1"}),
        s.path("node" + std::to_string(i) + ".log")));
  }
  // Whichever node is group rank 0 logs the steps; wait until training is well under way.
  std::string logger;
  const auto start = std::chrono::steady_clock::now();
  while (logger.empty() && std::chrono::steady_clock::now() - start < 120s) {
    for (int i = 0; i < 2; ++i) {
      if (last_logged_step(read_file(s.path("node" + std::to_string(i) + ".log"))) >= 25) {
        logger = s.path("node" + std::to_string(i) + ".log");
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE_FALSE(logger.empty());

  // Node 1 vanishes from the network (the daemon is on node 0: node 0 survives).
  const auto fault = std::chrono::steady_clock::now();
  REQUIRE(cluster.set_link(1, false, s.path("ip.log")));
  const int step_at_fault = last_logged_step(read_file(logger));
  const auto detected = time_until_text(
      s.path("node0.log"), "left (no keep-alive for 2000 ms)): restarting", fault, 30s);
  REQUIRE(detected);
  const auto reformed =
      time_until_text(s.path("node0.log"), "round 1: group rank 0 of 1", fault, 30s);
  REQUIRE(reformed);
  const auto resumed = time_until_text(s.path("node0.log"), "resumed at step ", fault, 60s);
  REQUIRE(resumed);

  // The link comes back: the cut-off agent, which kept trying, finds that the rendezvous dropped
  // it, and joins again; its arrival reopens the round and the job grows back to 2 nodes.
  const auto back = std::chrono::steady_clock::now();
  REQUIRE(cluster.set_link(1, true, s.path("ip_up.log")));
  // Its first sign of life after the partition: the daemon closed its connection when it
  // dropped it, and that close arrives now (unless a worker's broken collective is seen first).
  const auto rejoined = time_until_text(s.path("node1.log"), "lost the rendezvous", back, 60s);
  const auto regrown = time_until_count([&] { return read_file(s.path("ctrund.log")); },
                                        "formed: 2 nodes", 2, back, 60s);

  const std::string survivor_log = s.path("node0.log");
  INFO("node0:\n"
       << read_file(survivor_log) << "\nnode1:\n"
       << read_file(s.path("node1.log")) << "\nctrund:\n"
       << read_file(s.path("ctrund.log")));
  REQUIRE(rejoined);
  REQUIRE(regrown);
  // Both finish the job together.
  CHECK(agents[0]->wait(180s) == 0);
  CHECK(agents[1]->wait(60s) == 0);
  const std::string out = read_file(survivor_log) + read_file(s.path("node1.log"));
  CHECK(out.find("parameters identical on all 4 rank(s)") != std::string::npos);
  CHECK(out.find("final loss ") != std::string::npos);
  // At most the steps since the last checkpoint are lost (+1: the fault lands between reading
  // the log and the step's end).
  const std::string survivor = read_file(survivor_log);
  const auto at = survivor.find("resumed at step ");
  const int resumed_step = std::atoi(survivor.c_str() + at + 16);
  const int lost = step_at_fault - resumed_step;
  // (Times are from the link going down to the survivor's log showing it, polled every 20 ms.)
  std::cout << "link down: detected after " << detected->count() << " ms, re-formed after "
            << reformed->count() << " ms, training resumed after " << resumed->count()
            << " ms; steps lost " << lost << " (checkpoint every " << checkpoint_every << ")"
            << std::endl;
  std::cout << "link back: the node heard it was dropped after " << rejoined->count()
            << " ms, the job had 2 nodes again after " << regrown->count() << " ms" << std::endl;
  CHECK(detected->count() < 2000 + 3000);  // keep_alive_interval x max_attempt, and slack
  CHECK(lost >= 0);
  CHECK(lost <= checkpoint_every + 1);
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE("cluster: with --fault_tolerance=step a node's link goes down and up, nobody restarts") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  Cluster cluster(3);
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_ft_link");
  auto daemon = start_daemon(cluster, s);
  const std::string consumed = s.path("consumed");
  // Long enough (1024 steps of three replicas) that the cut-off node comes back while the job
  // still trains.
  const std::uint64_t samples = 49152;
  const auto agents = start_ft_agents(cluster, s, 3, samples, consumed, 30000);
  auto dump = [&] { return all_logs(s, 3) + "ctrund:\n" + read_file(s.path("ctrund.log")); };
  REQUIRE(wait_for_lines(consumed, 3 * 20, 120s));  // 20 steps committed by each replica

  // Node 1 vanishes from the network for 4 s: longer than the replicas' heartbeat timeout
  // (0.5 s) and the agents' keep-alives (2 s), so the quorum and the rendezvous both drop it.
  const long long down_ms = unix_ms_now();
  REQUIRE(cluster.set_link(1, false, s.path("ip.log")));
  std::this_thread::sleep_for(4s);
  const long long up_ms = unix_ms_now();
  REQUIRE(cluster.set_link(1, true, s.path("ip_up.log")));

  std::vector<std::optional<int>> codes;
  for (auto& agent : agents) codes.push_back(agent->wait(240s));
  const std::string all = all_logs(s, 3);
  INFO(dump());
  for (const auto& code : codes) {
    REQUIRE(code);
    CHECK(*code == 0);
  }
  // The cut-off node took its place in the rounds again with its worker running; the worker,
  // left out of the quorum while away (it committed nothing then: it was the minority), healed
  // from a peer when it was back. Nobody was restarted.
  const std::string node1 = read_file(s.path("node1.log"));
  CHECK(node1.find("joining again; the workers run on") != std::string::npos);
  CHECK(node1.find("healed from ") != std::string::npos);
  CHECK(count_of(all, "restarting") == 0);
  const auto lines = replica_lines(all);
  REQUIRE(lines.size() == 3);
  check_kept_processes(lines);
  const auto commits = read_consumed(consumed);
  REQUIRE(commits.size() == 3);
  const auto node1_replica = replica_lines(node1).begin()->first;
  const auto survivor = replica_lines(read_file(s.path("node0.log"))).begin()->first;
  check_commits(commits, samples);
  // The majority trained on while node 1 was away; node 1 committed nothing in that time
  // (from a second after the link went down: a step in flight may end just after).
  int majority_steps = 0;
  for (const auto& [step, c] : commits.at(survivor)) {
    if (c.unix_ms > down_ms + 1000 && c.unix_ms < up_ms) ++majority_steps;
  }
  CHECK(majority_steps > 10);
  for (const auto& [step, c] : commits.at(node1_replica)) {
    INFO("node 1 step " << step);
    CHECK_FALSE((c.unix_ms > down_ms + 1000 && c.unix_ms < up_ms));
  }
  std::cout << "fault-tolerant link down 4 s: the majority committed " << majority_steps
            << " steps meanwhile; node 1 healed and all three finished with the same parameters"
            << std::endl;
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE("cluster: with --fault_tolerance=step a node cut off for good stops, the rest finish") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  Cluster cluster(3);
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_ft_minority");
  auto daemon = start_daemon(cluster, s);
  const std::string consumed = s.path("consumed");
  const std::uint64_t samples = 24576;
  // A replica that gets no quorum for 5 s stops.
  const auto agents = start_ft_agents(cluster, s, 3, samples, consumed, 5000, ",join_timeout=10");
  auto dump = [&] { return all_logs(s, 3) + "ctrund:\n" + read_file(s.path("ctrund.log")); };
  REQUIRE(wait_for_lines(consumed, 3 * 20, 120s));

  // Node 1 is cut off and stays so: alone, it is the minority of its last quorum.
  const long long down_ms = unix_ms_now();
  REQUIRE(cluster.set_link(1, false, s.path("ip.log")));
  const auto cut_off = agents[1]->wait(90s);
  const auto code0 = agents[0]->wait(240s);
  const auto code2 = agents[2]->wait(60s);
  INFO(dump());
  // It stopped, saying why, instead of training on alone...
  REQUIRE(cut_off);
  CHECK(*cut_off != 0);
  const std::string node1 = read_file(s.path("node1.log"));
  CHECK(node1.find("no quorum for step ") != std::string::npos);
  // ... and the others finished with the same parameters, in their first processes.
  REQUIRE(code0);
  REQUIRE(code2);
  CHECK(*code0 == 0);
  CHECK(*code2 == 0);
  auto lines = replica_lines(read_file(s.path("node0.log")));
  const auto lines2 = replica_lines(read_file(s.path("node2.log")));
  REQUIRE(lines.size() == 1);
  REQUIRE(lines2.size() == 1);
  lines.insert(lines2.begin(), lines2.end());
  check_kept_processes(lines);
  // Every step node 1 committed is the one the others committed (it never diverged), and it
  // committed nothing once cut off (a step in flight may end within the collective timeout).
  const auto commits = read_consumed(consumed);
  check_commits(commits, samples);
  const auto node1_replica = replica_lines(node1).begin()->first;
  REQUIRE(commits.count(node1_replica));
  for (const auto& [step, c] : commits.at(node1_replica)) {
    INFO("node 1 step " << step);
    CHECK(c.unix_ms < down_ms + 1000);
  }
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE("cluster: agents stopped one by one, SIGTERM then SIGKILL, until below min nodes") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  constexpr int kNodes = 4;
  Cluster cluster(kNodes);
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_agents");
  auto daemon = start_daemon(cluster, s);
  // A 2:4 job, one worker per node; a round that cannot reach 2 nodes fails after 10 s.
  const int checkpoint_every = 10;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < kNodes; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        cluster.on(i, {CTRUN_PATH,
                       "--nnodes=2:4",
                       "--nproc_per_node=1",
                       "--rdzv_backend=c10d",
                       "--rdzv_endpoint=" + Cluster::address(0) + ":29400",
                       "--rdzv_id=job",
                       "--rdzv_conf=is_host=false,join_timeout=10,last_call_timeout=2",
                       "--max_restarts=3",
                       "--shutdown_timeout=5",
                       MLP_PATH,
                       "--epochs",
                       "1000",
                       "--samples",
                       "4096",
                       "--checkpoint_dir",
                       s.path("ckpt"),
                       "--checkpoint_every",
                       std::to_string(checkpoint_every),
                       "--log_every",
                       "1"}),
        s.path("node" + std::to_string(i) + ".log")));
  }
  auto logs = [&] { return all_logs(s, kNodes); };
  auto dump = [&] {
    std::string out;
    for (int i = 0; i < kNodes; ++i) {
      out += "node" + std::to_string(i) + ":\n" +
             read_file(s.path("node" + std::to_string(i) + ".log"));
    }
    return out + "ctrund:\n" + read_file(s.path("ctrund.log"));
  };
  auto training_past = [&](int step) {
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (highest(s, kNodes, last_logged_step) >= step) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  };
  INFO(dump());
  REQUIRE(training_past(25));

  // 1. SIGTERM to node 3's agent: its worker is stopped, it leaves, the other three re-form at
  //    once (no keep-alive to wait for, no restart spent) and resume from the checkpoint.
  struct Fault {
    int node;
    int signo;
    std::size_t round_formed;  // the ctrund log's "formed: N nodes" for the new round
  };
  for (const Fault& f : {Fault{3, SIGTERM, 3}, Fault{2, SIGKILL, 2}}) {
    const std::size_t resumed_before = count_of(logs(), "resumed at step ");
    const int step_at_fault = highest(s, kNodes, last_logged_step);
    const auto fault = std::chrono::steady_clock::now();
    agents[f.node]->signal(f.signo);
    const auto code = agents[f.node]->wait(30s);
    REQUIRE(code.has_value());
    CHECK(*code != 0);
    const auto reformed =
        time_until_count([&] { return read_file(s.path("ctrund.log")); },
                         "formed: " + std::to_string(f.round_formed) + " nodes", 1, fault, 30s);
    const auto resumed = time_until_count(logs, "resumed at step ", resumed_before + 1, fault, 60s);
    INFO(dump());
    REQUIRE(reformed);
    REQUIRE(resumed);
    const int lost = step_at_fault - highest(s, kNodes, last_resumed_step);
    std::cout << (f.signo == SIGTERM ? "SIGTERM" : "SIGKILL") << " to node " << f.node
              << "'s agent: re-formed with " << f.round_formed << " nodes after "
              << reformed->count() << " ms, training resumed after " << resumed->count()
              << " ms; steps lost " << lost << " (checkpoint every " << checkpoint_every << ")"
              << std::endl;
    CHECK(lost >= 0);
    CHECK(lost <= checkpoint_every + 1);
    REQUIRE(training_past(highest(s, kNodes, last_logged_step) + 3));
  }
  CHECK(read_file(s.path("node3.log")).find("received SIGTERM: stopping workers") !=
        std::string::npos);
  // A re-form for a node that left is free: no restart was spent on either.
  CHECK(count_of(read_file(s.path("node0.log")), "restarting the job") == 0);

  // 2. SIGKILL node 1: node 0 alone is below min nodes. It fails with a clear line once
  //    join_timeout passes, instead of waiting forever.
  const auto fault = std::chrono::steady_clock::now();
  agents[1]->signal(SIGKILL);
  const auto code = agents[0]->wait(60s);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - fault).count();
  INFO(dump());
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  const std::string last = read_file(s.path("node0.log"));
  CHECK(last.find("did not form within join_timeout (10000 ms): 1 of min 2 nodes joined") !=
        std::string::npos);
  std::cout << "below min nodes: node 0 failed " << took << " s after the last peer died"
            << std::endl;
  CHECK(took < 10 + 10);
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE("cluster: a planned lost link between two nodes stalls their training for its time") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  Cluster cluster(3);
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_link_fault");
  // The daemon on a third host, so that only the link between the two training nodes is lost:
  // their gloo traffic stops for 3 s from rank 0's step 20, nftables dropping it both ways on
  // node 0, and goes on once the rules are gone; nobody restarts.
  auto daemon = start_daemon(cluster, s, 2);
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        cluster.on(i, {CTRUN_PATH, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=" + Cluster::address(2) + ":29400", "--rdzv_id=job",
                       "--rdzv_conf=is_host=false", "--faults",
                       "link_lost:node=0,peer=1,at_step=20,duration=3", "--fault_report",
                       s.path("report" + std::to_string(i) + ".json"), MLP_PATH, "--epochs", "2",
                       "--samples", "2048", "--seed", "3"}),
        s.path("node" + std::to_string(i) + ".log")));
  }
  for (int i = 0; i < 2; ++i) {
    INFO("node " << i << ":\n" << read_file(s.path("node" + std::to_string(i) + ".log")));
    CHECK(agents[i]->wait(180s) == 0);
  }
  const std::string logs = all_logs(s, 2);
  INFO(logs);
  CHECK(count_of(logs,
                 "injecting fault 1: the link between node 0 and node 1 lost for 3.000 s "
                 "at step 20") == 1);
  CHECK(logs.find("fault 1: the link to node 1 (198.18.0.") != std::string::npos);
  CHECK(logs.find("fault 1: the link is back") != std::string::npos);
  CHECK(logs.find("restarting") == std::string::npos);
  CHECK(logs.find("parameters identical on all 2 rank(s)") != std::string::npos);
  // The training stood still while the link was down: the dozen steps left after step 20 take
  // a few hundred ms (about 25 ms each here), yet the job ended no sooner than the link's 3 s
  // after the cut. (A step or two in flight may still end: the report's first step after the
  // fault is no measure of the stall.)
  int reports = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string log = read_file(s.path("node" + std::to_string(i) + ".log"));
    const Json report = Json::parse(read_file(s.path("report" + std::to_string(i) + ".json")));
    if (report["faults"].empty()) continue;
    ++reports;
    const auto cut = stamp_ms(log, "fault 1: the link to node 1");
    const auto end = stamp_ms(log, "fault 1: step ");
    REQUIRE(cut);
    REQUIRE(end);
    CHECK(*end - *cut >= 2900);
  }
  CHECK(reports == 1);
  // No rule outlives the fault, on either node.
  for (int i = 0; i < 2; ++i) {
    ChildProcess nft(cluster.on(i, {"/usr/sbin/nft", "list", "tables"}),
                     s.path("nft" + std::to_string(i) + ".log"));
    CHECK(nft.wait(10s) == 0);
    CHECK(read_file(s.path("nft" + std::to_string(i) + ".log")).find("ctrun_fault") ==
          std::string::npos);
  }
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE(
    "cluster: a rank stuck in its own function on one namespace host is named by the hang "
    "report") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  SystemPython python;
  Cluster cluster(2);
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_hang_report");
  auto daemon = start_daemon(cluster, s);
  // Four Python gloo ranks on two hosts; rank 3 stops in slow_data before its all_reduce of step
  // 5, the others wait for it there, and --worker_timeout (4 s) finds them all hung.
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    const std::string n = std::to_string(i);
    agents.push_back(std::make_unique<ChildProcess>(
        // Python's gloo finds its address by the host name, which is the same (loopback) in
        // every namespace: name the interface instead.
        cluster.on(i, {"/usr/bin/env", "GLOO_SOCKET_IFNAME=eth0", CTRUN_PATH, "--nnodes=2",
                       "--nproc_per_node=2", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=" + Cluster::address(0) + ":29400", "--rdzv_id=job",
                       "--rdzv_conf=is_host=false", "--max_restarts=0", "--worker_timeout=4",
                       "--log_dir", s.path("logs" + n), "--event_log", s.path("events" + n),
                       HANG_IN_OWN_FUNCTION_SCRIPT_PATH, "3", "5"}),
        s.path("node" + n + ".log")));
  }
  for (int i = 0; i < 2; ++i) CHECK(agents[i]->wait(120s) != 0);
  INFO("node 0:\n"
       << read_file(s.path("node0.log")) << "\nnode 1:\n"
       << read_file(s.path("node1.log")));
  int reports = 0;
  for (int i = 0; i < 2; ++i) {
    std::istringstream lines(read_file(s.path("events" + std::to_string(i))));
    for (std::string line; std::getline(lines, line);) {
      const auto e = nlohmann::json::parse(line, nullptr, false);
      if (!e.is_object() || e.value("event", "") != "hang_report") continue;
      ++reports;
      CHECK(e["suspects"] == nlohmann::json::array({3}));
      const auto report = nlohmann::json::parse(read_file(e.value("file", "")), nullptr, false);
      REQUIRE(report.is_object());
      CHECK(report["ranks"].size() == 4);  // both hosts answered
      CHECK(report["missing_nodes"].empty());
    }
  }
  CHECK(reports >= 1);
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE("cluster: on two namespace hosts the rank a synchronous DDP job waits for is named",
          "[sync_ddp]") {
  if (!root()) {
    CTRUN_SKIP("needs root to create network namespaces (scripts/netns-cluster.sh)");
  }
  Cluster cluster(2, "s");
  INFO(cluster.setup_log());
  REQUIRE(cluster.ok());
  ScratchDir s("cluster_straggler");
  SystemPython python;
  auto daemon = start_daemon(cluster, s);
  // An unmodified torch DDP script over Gloo between the hosts; rank 3 sleeps 0.2 s more in its
  // batch function from step 20 to 50, the others wait for it in DDP's all-reduce.
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        // Every namespace has this machine's host name, which resolves to loopback: gloo is
        // told its interface, as on a cluster whose host names do not reach the peers.
        cluster.on(i, {"/usr/bin/env",
                       "GLOO_SOCKET_IFNAME=eth0",
                       CTRUN_PATH,
                       "--nnodes=2",
                       "--nproc_per_node=2",
                       "--rdzv_backend=c10d",
                       "--rdzv_endpoint=" + Cluster::address(0) + ":29400",
                       "--rdzv_id=job",
                       "--rdzv_conf=is_host=false",
                       "--node_rank=" + std::to_string(i),
                       "--straggler_factor=2",
                       "--straggler_window=10",
                       "--straggler_interval=1",
                       "--event_log",
                       s.path("events." + std::to_string(i)),
                       DDP_SYNC_SCRIPT_PATH,
                       "150",
                       "--slow",
                       "3",
                       "--from",
                       "20",
                       "--to",
                       "50"}),
        s.path("node" + std::to_string(i) + ".log")));
  }
  for (int i = 0; i < 2; ++i) {
    INFO("node " << i << ":\n" << read_file(s.path("node" + std::to_string(i) + ".log")));
    REQUIRE(agents[i]->wait(180s) == 0);
  }
  for (int i = 0; i < 2; ++i) {
    const std::string log = read_file(s.path("node" + std::to_string(i) + ".log"));
    INFO(log);
    // The host is the namespace's: its rank 3 is on node 1's address.
    CHECK(log.find("rank 3 on ") != std::string::npos);
    CHECK(log.find(" holds every step for ") != std::string::npos);
    CHECK(log.find("waiting for input") != std::string::npos);
    CHECK(log.find("is back to the job's pace") != std::string::npos);
    std::istringstream events(read_file(s.path("events." + std::to_string(i))));
    int named = 0;
    for (std::string line; std::getline(events, line);) {
      const auto e = nlohmann::json::parse(line, nullptr, false);
      if (!e.is_object() || e.value("event", "") != "straggler") continue;
      ++named;
      CHECK(e["ranks"] == nlohmann::json::array({3}));
    }
    CHECK(named >= 1);
  }
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}
