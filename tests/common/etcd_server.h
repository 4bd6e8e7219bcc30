// Test helper: real etcd members (Debian's etcd-server) on loopback ports with data under a
// scratch directory, stopped and reaped by PID when the test ends. Bounded waits only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
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

// Clients reach the members over TLS with this certificate and key; with `client_ca`, each
// client must present a certificate that CA signed (etcd's --client-cert-auth).
struct EtcdTls {
  std::string cert;
  std::string key;
  std::string client_ca;
};

class EtcdCluster {
 public:
  // `members` etcd processes forming one cluster (1 for a single server). Returns once every
  // member accepts connections on its client port, or throws with the members' logs.
  // `extra`: more flags for every member (--auth-token-ttl=1).
  EtcdCluster(const ScratchDir& dir, int members, const std::string& name = "etcd",
              std::optional<EtcdTls> tls = std::nullopt, std::vector<std::string> extra = {});
  ~EtcdCluster();

  static bool installed();
  // "127.0.0.1:P1,127.0.0.1:P2,..." for --rdzv_endpoint.
  std::string endpoints() const;
  // The same with each member's scheme: "https://127.0.0.1:P1,..." over TLS.
  std::string urls() const;
  std::uint16_t client_port(int member) const { return members_[member].client_port; }
  void kill(int member);   // SIGKILL, reaped
  void start(int member);  // again, same data directory and ports
  std::string log(int member) const;
  // etcd's auth turned on through etcdctl: root (etcd needs it first), and `user` with
  // `password` in a role that may read and write the keys under `prefix`. Empty when every
  // step worked, else the step that failed and what etcdctl said.
  std::string enable_auth(const std::string& user, const std::string& password,
                          const std::string& prefix) const;

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
  std::string dir_;  // the scratch directory: data, logs
  std::string initial_cluster_;
  std::string token_;
  std::optional<EtcdTls> tls_;
  std::vector<std::string> extra_;
};

}  // namespace ctrun::testing
