// etcd over TLS and with users, end to end: a real etcd (Debian's etcd-server) the test starts
// with TLS and client-certificate auth, or with a user and a role, and certificates made on the
// spot (test_certs.h). A job passes; every bad setup is one line that names its cause; no secret
// reaches a log, the event log or the workers' environment.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "catch.h"
#include "etcd_server.h"
#include "process.h"
#include "test_certs.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// `ctrun status` against `endpoint` with `conf` (a quick one-shot client, as the agents'):
// its exit code and its output.
std::pair<std::optional<int>, std::string> status(const ScratchDir& s, const std::string& name,
                                                  const std::string& endpoint,
                                                  const std::string& conf) {
  ChildProcess p({CTRUN_PATH, "status", "--rdzv_backend=etcd", "--rdzv_endpoint=" + endpoint,
                  "--rdzv_conf=" + conf, "--timeout=3"},
                 s.path(name));
  const auto code = p.wait(30s);
  return {code, read_file(s.path(name))};
}

}  // namespace

TEST_CASE("etcd tls: a two-node mlp job over TLS with client certificates") {
  CTRUN_SKIP_WITHOUT_ETCD();
#ifndef MLP_PATH
  CTRUN_SKIP("built without LibTorch: no mlp trainer");
#else
  ScratchDir s("etcd_tls_job");
  TestPki pki(s.path("pki"));
  EtcdCluster etcd(s, 1, "etcd", EtcdTls{pki.server.cert, pki.server.key, pki.ca.cert});
  // The agents and their C++ workers (whose store is etcd too) all over TLS.
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{CTRUN_PATH, "--nnodes=2", "--nproc_per_node=1",
                                 "--rdzv_backend=etcd", "--rdzv_endpoint=" + etcd.urls(),
                                 "--rdzv_id=tls", "--rdzv_conf=" + pki.rdzv_conf(pki.ca), MLP_PATH,
                                 "--epochs", "1", "--samples", "256", "--seed", "3"},
        s.path("node" + std::to_string(i) + ".log")));
  }
  for (int i = 0; i < 2; ++i) {
    INFO("node " << i << ":\n" << read_file(s.path("node" + std::to_string(i) + ".log")));
    CHECK(agents[i]->wait(120s) == 0);
  }
  const std::string logs = read_file(s.path("node0.log")) + read_file(s.path("node1.log"));
  CHECK(logs.find("parameters identical on all 2 rank(s)") != std::string::npos);
  // ctrun status reads the finished job over TLS too.
  const auto [code, out] = status(s, "status.log", etcd.urls(), pki.rdzv_conf(pki.ca));
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("tls") != std::string::npos);
#endif
}

TEST_CASE("etcd tls: each bad setup is one line that names its cause") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_tls_bad");
  TestPki pki(s.path("pki"));
  EtcdCluster good(s, 1, "good", EtcdTls{pki.server.cert, pki.server.key, pki.ca.cert});
  EtcdCluster expired(s, 1, "expired", EtcdTls{pki.expired.cert, pki.expired.key, ""});
  EtcdCluster future(s, 1, "future", EtcdTls{pki.future.cert, pki.future.key, ""});
  EtcdCluster elsewhere(s, 1, "elsewhere", EtcdTls{pki.elsewhere.cert, pki.elsewhere.key, ""});
  EtcdCluster plain(s, 1, "plain");
  struct Case {
    std::string name, endpoint, conf, line;
  };
  const std::vector<Case> cases = {
      {"unknown CA", good.urls(), pki.rdzv_conf(pki.other_ca),
       "certificate verify failed: unable to get local issuer certificate (the server's "
       "certificate is not signed by a CA given: check cacert)"},
      {"expired", expired.urls(), pki.rdzv_conf(pki.ca, false),
       "certificate verify failed: certificate has expired (the server's certificate)"},
      {"not yet valid", future.urls(), pki.rdzv_conf(pki.ca, false),
       "certificate verify failed: certificate is not yet valid (the server's certificate)"},
      {"host name", elsewhere.urls(), pki.rdzv_conf(pki.ca, false),
       "certificate verify failed: IP address mismatch (the server's certificate names another "
       "host)"},
      {"no client certificate", good.urls(), pki.rdzv_conf(pki.ca, false),
       "the server refused this client's certificate"},
      {"plain endpoint for TLS", "http://127.0.0.1:" + std::to_string(good.client_port(0)), "",
       "end of stream (closed at the first request: if it serves TLS, give https:// endpoints "
       "or --rdzv_conf protocol=https)"},
      {"TLS to a plain server", "https://127.0.0.1:" + std::to_string(plain.client_port(0)),
       pki.rdzv_conf(pki.ca, false), "is it a plain http:// endpoint?"},
      {"missing CA file", good.urls(), "cacert=" + s.path("nowhere.pem"),
       "CA file '" + s.path("nowhere.pem") + "': No such file or directory"},
  };
  int n = 0;
  for (const auto& c : cases) {
    INFO(c.name);
    const auto [code, out] = status(s, "case" + std::to_string(n++) + ".log", c.endpoint, c.conf);
    INFO(out);
    REQUIRE(code.has_value());
    CHECK(*code != 0);
    CHECK(out.find(c.line) != std::string::npos);
    CHECK(count_of(out, "\n") == 1);  // one line
  }
}

TEST_CASE("etcd tls: a user with a role, its password in a file and nowhere else") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_users");
  EtcdCluster etcd(s, 1, "auth");
  // root (etcd needs it to enable auth) and a user whose role may read and write ctrun's keys.
  const std::string password = "s3cret-Pa55word";
  REQUIRE(etcd.enable_auth("alice", password, "/ctrun/") == "");
  write_file(s.path("password"), password + "\n");
  write_file(s.path("wrong"), "not-it\n");

  // A one-node job as alice: its workers get the password file's path, never the password.
  ChildProcess agent({CTRUN_PATH, "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=etcd",
                      "--rdzv_endpoint=" + etcd.urls(), "--rdzv_id=users",
                      "--rdzv_conf=user=alice,password_file=" + s.path("password"), "--event_log",
                      s.path("events.jsonl"), TEST_WORKER_PATH, "dumpenv", s.path("env")},
                     s.path("agent.log"));
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(rc == 0);
  const std::string env = read_file(s.path("env.0"));
  CHECK(env.find("CTRUN_STORE_USER=alice") != std::string::npos);
  CHECK(env.find("CTRUN_STORE_PASSWORD_FILE=" + s.path("password")) != std::string::npos);
  for (const auto& file : {"agent.log", "events.jsonl", "env.0"}) {
    INFO(file);
    CHECK(read_file(s.path(file)).find(password) == std::string::npos);
  }

  const auto [ok_code, ok_out] =
      status(s, "status.log", etcd.urls(), "user=alice,password_file=" + s.path("password"));
  INFO(ok_out);
  CHECK(ok_code == 0);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"user=alice,password_file=" + s.path("wrong"),
       "etcd: user 'alice': etcdserver: authentication failed, invalid user ID or password"},
      {"", "auth is enabled there: give --rdzv_conf user=NAME,password_file=FILE"},
      {"user=alice", "--rdzv_conf: an etcd user needs both user and password_file"},
      {"user=alice,password_file=" + s.path("absent"),
       "etcd: password_file '" + s.path("absent") + "': No such file or directory"},
  };
  int n = 0;
  for (const auto& [conf, line] : bad) {
    INFO(conf);
    const auto [code, out] = status(s, "bad" + std::to_string(n++) + ".log", etcd.urls(), conf);
    INFO(out);
    REQUIRE(code.has_value());
    CHECK(*code != 0);
    CHECK(out.find(line) != std::string::npos);
    CHECK(out.find("not-it") == std::string::npos);
  }
}
