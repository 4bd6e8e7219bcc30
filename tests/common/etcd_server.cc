#include "etcd_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

namespace ctrun::testing {
namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";

bool accepts(std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

std::string url(std::uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

}  // namespace

bool EtcdCluster::installed() { return access(kEtcd, X_OK) == 0; }

EtcdCluster::EtcdCluster(const ScratchDir& dir, int members, const std::string& name,
                         std::optional<EtcdTls> tls, std::vector<std::string> extra)
    : dir_(dir.path()),
      token_(name + "-" + std::to_string(getpid())),
      tls_(std::move(tls)),
      extra_(std::move(extra)) {
  members_.resize(members);
  for (int i = 0; i < members; ++i) {
    Member& m = members_[i];
    m.name = name + std::to_string(i);
    m.data_dir = dir.path(m.name + ".data");
    m.log = dir.path(m.name + ".log");
    m.client_port = free_port();
    m.peer_port = free_port();
    initial_cluster_ += (i ? "," : "") + m.name + "=" + url(m.peer_port);
  }
  for (auto& m : members_) launch(m, true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (auto& m : members_) {
    while (!accepts(m.client_port)) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("etcd member " + m.name + " did not start:\n" + read_file(m.log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_) m.process.reset();  // SIGKILL and reap, by PID
}

void EtcdCluster::launch(Member& m, bool first_start) {
  // Short heartbeats and elections so a lost member is replaced quickly; no fsync: the tests'
  // data need not survive a power cut, and fsync on a shared CI disk costs seconds.
  const std::string client_url =
      tls_ ? "https://127.0.0.1:" + std::to_string(m.client_port) : url(m.client_port);
  std::vector<std::string> argv = {kEtcd,
                                   "--name",
                                   m.name,
                                   "--data-dir",
                                   m.data_dir,
                                   "--listen-client-urls",
                                   client_url,
                                   "--advertise-client-urls",
                                   client_url,
                                   "--listen-peer-urls",
                                   url(m.peer_port),
                                   "--initial-advertise-peer-urls",
                                   url(m.peer_port),
                                   "--initial-cluster",
                                   initial_cluster_,
                                   "--initial-cluster-token",
                                   token_,
                                   "--initial-cluster-state",
                                   first_start ? "new" : "existing",
                                   "--heartbeat-interval=50",
                                   "--election-timeout=500",
                                   "--unsafe-no-fsync",
                                   "--logger=zap",
                                   "--log-level=error"};
  if (tls_) {
    argv.insert(argv.end(), {"--cert-file", tls_->cert, "--key-file", tls_->key});
    if (!tls_->client_ca.empty()) {
      argv.insert(argv.end(), {"--client-cert-auth", "--trusted-ca-file", tls_->client_ca});
    }
  }
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  m.process = std::make_unique<ChildProcess>(argv, m.log);
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (const auto& m : members_)
    out += std::string(out.empty() ? "" : ",") + "127.0.0.1:" + std::to_string(m.client_port);
  return out;
}

std::string EtcdCluster::urls() const {
  std::string out;
  for (const auto& m : members_) {
    out += std::string(out.empty() ? "" : ",") + (tls_ ? "https" : "http") +
           "://127.0.0.1:" + std::to_string(m.client_port);
  }
  return out;
}

void EtcdCluster::kill(int member) {
  Member& m = members_[member];
  if (!m.process) return;
  m.process->signal(SIGKILL);
  (void)m.process->wait(std::chrono::seconds(10));
  m.process.reset();
}

void EtcdCluster::start(int member) {
  Member& m = members_[member];
  if (m.process) return;
  launch(m, false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!accepts(m.client_port)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("etcd member " + m.name + " did not restart:\n" + read_file(m.log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string EtcdCluster::log(int member) const { return read_file(members_[member].log); }

std::string EtcdCluster::enable_auth(const std::string& user, const std::string& password,
                                     const std::string& prefix) const {
  const std::string role = user + "-role";
  const std::vector<std::vector<std::string>> steps = {
      {"user", "add", "root:rootpw"},
      {"role", "add", role},
      {"role", "grant-permission", role, "--prefix=true", "readwrite", prefix},
      {"user", "add", user + ":" + password},
      {"user", "grant-role", user, role},
      {"auth", "enable"},
  };
  int n = 0;
  for (auto step : steps) {
    const std::string log = dir_ + "/etcdctl" + std::to_string(n++) + ".log";
    const std::string what = step[0] + " " + step[1];
    step.insert(step.begin(), {"/usr/bin/etcdctl", "--endpoints=" + urls()});
    ChildProcess etcdctl(step, log);
    if (etcdctl.wait(std::chrono::seconds(20)) != 0) {
      return "etcdctl " + what + " failed: " + read_file(log);
    }
  }
  return "";
}

}  // namespace ctrun::testing
