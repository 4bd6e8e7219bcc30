// Test helper: hosts as network namespaces from scripts/netns-cluster.sh, made for one test
// (a unique prefix) and removed when it ends. Needs root.
#pragma once

#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"

namespace ctrun::testing {

// N namespaces, removed (by their names) when the test ends, whatever happens.
class Cluster {
 public:
  explicit Cluster(int nodes, const std::string& tag = "c")
      : prefix_(tag + std::to_string(getpid() % 100000)), log_("cluster") {
    ChildProcess up(
        {"/bin/bash", NETNS_CLUSTER_PATH, "up", std::to_string(nodes), "--prefix", prefix_},
        log_.path("up.log"));
    ok_ = up.wait(std::chrono::seconds(60)) == 0;
  }
  ~Cluster() {
    ChildProcess down({"/bin/bash", NETNS_CLUSTER_PATH, "down", "--prefix", prefix_},
                      log_.path("down.log"));
    down.wait(std::chrono::seconds(60));
  }
  bool ok() const { return ok_; }
  std::string setup_log() const { return read_file(log_.path("up.log")); }
  std::string ns(int node) const { return prefix_ + "-node" + std::to_string(node); }
  static std::string address(int node) { return "198.18.0." + std::to_string(10 + node); }
  // Takes node `node`'s link down or brings it up (ip -n NS link set eth0 ...); whether that
  // worked within 10 s. `log` takes ip's output.
  bool set_link(int node, bool up, const std::string& log) const {
    ChildProcess ip({"/usr/sbin/ip", "-n", ns(node), "link", "set", "eth0", up ? "up" : "down"},
                    log);
    return ip.wait(std::chrono::seconds(10)) == 0;
  }
  // The PIDs of every process in node `node`'s namespace (ip netns pids); `file` takes ip's
  // output on the way.
  std::vector<pid_t> pids(int node, const std::string& file) const {
    ChildProcess ip({"/usr/sbin/ip", "netns", "pids", ns(node)}, file);
    std::vector<pid_t> out;
    if (ip.wait(std::chrono::seconds(10)) != 0) return out;
    std::istringstream in(read_file(file));
    for (long pid; in >> pid;) out.push_back(static_cast<pid_t>(pid));
    ::unlink(file.c_str());
    return out;
  }
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

}  // namespace ctrun::testing
