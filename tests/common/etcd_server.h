// Test helper: real etcd members (Debian's etcd-server) on loopback ports with data under a
// scratch directory, stopped and reaped by PID when the test ends. Bounded waits only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "process.h"
#include "skip.h"

// In a Catch2 test body: the test is skipped when etcd is not installed here.
#define CTRUN_SKIP_WITHOUT_ETCD()                                                         \
  if (!::ctrun::testing::EtcdCluster::installed()) {                                      \
    CTRUN_SKIP("/usr/bin/etcd is not installed (scripts/setup.sh installs etcd-server)"); \
  }

namespace ctrun::testing {

class EtcdCluster {
 public:
  // `members` etcd processes forming one cluster (1 for a single server). Returns once every
  // member accepts connections on its client port, or throws with the members' logs.
  EtcdCluster(const ScratchDir& dir, int members, const std::string& name = "etcd");
  ~EtcdCluster();

  static bool installed();
  // "127.0.0.1:P1,127.0.0.1:P2,..." for --rdzv_endpoint.
  std::string endpoints() const;
  std::uint16_t client_port(int member) const { return members_[member].client_port; }
  void kill(int member);   // SIGKILL, reaped
  void start(int member);  // again, same data directory and ports
  std::string log(int member) const;

 private:
  struct Member {
    std::string name;
    std::string data_dir;
    std::string log;
    std::uint16_t client_port = 0;
    std::uint16_t peer_port = 0;
    std::unique_ptr<ChildProcess> process;
  };
  void launch(Member& m, bool first_start);
  std::vector<Member> members_;
  std::string initial_cluster_;
  std::string token_;
};

}  // namespace ctrun::testing
