// Real multi-node jobs on one machine: hosts are network namespaces from
// scripts/netns-cluster.sh (each test makes its own, with a unique prefix, and removes it). A
// daemon in node0, one agent per node started by address as on a cluster, `mlp` training over
// Gloo across the namespaces. Needs root; elsewhere the tests say so and check nothing.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>

#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// N namespaces, removed (by their names) when the test ends, whatever happens.
class Cluster {
 public:
  explicit Cluster(int nodes) : prefix_("c" + std::to_string(getpid() % 100000)), log_("cluster") {
    ChildProcess up(
        {"/bin/bash", NETNS_CLUSTER_PATH, "up", std::to_string(nodes), "--prefix", prefix_},
        log_.path("up.log"));
    ok_ = up.wait(60s) == 0;
  }
  ~Cluster() {
    ChildProcess down({"/bin/bash", NETNS_CLUSTER_PATH, "down", "--prefix", prefix_},
                      log_.path("down.log"));
    down.wait(60s);
  }
  bool ok() const { return ok_; }
  std::string setup_log() const { return read_file(log_.path("up.log")); }
  std::string ns(int node) const { return prefix_ + "-node" + std::to_string(node); }
  static std::string address(int node) { return "198.18.0." + std::to_string(10 + node); }
  // argv run inside node `node`'s namespace (ip netns exec execs it: the PID is the program's).
  std::vector<std::string> on(int node, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", ns(node)});
    return argv;
  }

 private:
  std::string prefix_;
  ScratchDir log_;
  bool ok_ = false;
};

bool root() { return geteuid() == 0; }

}  // namespace

TEST_CASE("cluster: mlp trains across 2 and 3 namespace hosts, started by address") {
  if (!root()) {
    WARN("skipped: needs root to create network namespaces (scripts/netns-cluster.sh)");
    return;
  }
  for (int nodes : {2, 3}) {
    INFO(nodes << " nodes");
    Cluster cluster(nodes);
    INFO(cluster.setup_log());
    REQUIRE(cluster.ok());
    ScratchDir s("cluster_mlp");
    const std::string endpoint = Cluster::address(0) + ":29400";
    ChildProcess daemon(cluster.on(0, {CTRUND_PATH, "--host", Cluster::address(0), "--port",
                                       "29400", "--port_file", s.path("port")}),
                        s.path("ctrund.log"));
    REQUIRE(wait_for_file(s.path("port"), 10s));
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
    daemon.signal(SIGTERM);
    CHECK(daemon.wait(10s) == 0);
  }
}
