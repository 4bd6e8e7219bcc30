// ctrun's agents and their C++ workers against a ctrund with mutual TLS: a two-node job runs
// through the fault matrix's faults (a worker killed, a node cut off from the rendezvous, the
// daemon SIGKILLed and restarted with --state_dir), every reconnection over TLS, and ends with
// the clean run's parameters; `ctrun status` and `ctrun fault` reach it with --rdzv_conf; an
// agent without TLS settings stops at once with one line.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "ctrund_daemon.h"
#include "process.h"
#include "skip.h"
#include "test_certs.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> tls_flags(const TestPki& pki) {
  return {"--tls_cert",   pki.server.cert,   "--tls_key",
          pki.server.key, "--tls_client_ca", pki.ca.cert};
}

std::string digest_of(const std::string& log) {
  std::smatch m;
  return std::regex_search(log, m, std::regex("digest ([0-9a-f]{16})")) ? m[1].str() : "";
}

}  // namespace

TEST_CASE("ctrund tls: a two-node mlp job through worker, node and daemon faults") {
#ifndef MLP_PATH
  CTRUN_SKIP("built without LibTorch: no mlp trainer");
#else
  ScratchDir s("ctrund_tls_faults");
  TestPki pki(s.path("pki"));
  std::ofstream(s.path("token")) << "the-job-token\n";
  // 4 epochs of 96 steps per rank (about 2 s each here), a checkpoint every 8 steps.
  const std::vector<std::string> mlp = {
      MLP_PATH, "--epochs", "4", "--samples", "12288", "--seed", "3", "--checkpoint_every", "8"};
  auto job = [&](std::vector<std::string> ctrun_flags, const std::string& name) {
    std::vector<std::string> argv = {CTRUN_PATH};
    argv.insert(argv.end(), ctrun_flags.begin(), ctrun_flags.end());
    argv.insert(argv.end(), mlp.begin(), mlp.end());
    argv.insert(argv.end(), {"--checkpoint_dir", s.path(name + ".ckpt")});
    return argv;
  };
  ChildProcess clean(job({"--standalone", "--nproc_per_node=2"}, "clean"), s.path("clean.log"));
  REQUIRE(clean.wait(120s) == 0);
  const std::string clean_digest = digest_of(read_file(s.path("clean.log")));
  REQUIRE_FALSE(clean_digest.empty());

  std::vector<std::string> daemon_flags = tls_flags(pki);
  daemon_flags.insert(daemon_flags.end(),
                      {"--token_file", s.path("token"), "--state_dir", s.path("state")});
  auto daemon = std::make_unique<CtrundDaemon>(daemon_flags);
  const std::uint16_t port = daemon->port();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::string conf = pki.rdzv_conf(pki.ca) + ",token_file=" + s.path("token");
  // Node 1's worker killed at step 20 (a restart from the checkpoint at 16), then node 1 cut
  // off from the rendezvous for 2 s (ctrund drops it; it joins again over TLS).
  const std::string plan = "kill:rank=1,at_step=20;cut_off:node=1,after=3,duration=2";
  std::vector<std::unique_ptr<ChildProcess> > agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        job({"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
             "--rdzv_endpoint=" + endpoint, "--rdzv_id=tls-faults", "--rdzv_conf=" + conf,
             "--max_restarts=6", "--faults=" + plan},
            "node"),
        s.path("node" + std::to_string(i) + ".log")));
  }
  // The daemon SIGKILLed late in the job (after both planned faults), back 1 s later on the
  // same port and state.
  // (Rank 0's worker says its epochs, on whichever node got group rank 0.)
  bool late = false;
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  while (!late && std::chrono::steady_clock::now() < deadline) {
    late = wait_for_text(s.path("node0.log"), "epoch 3/4", 100ms) ||
           wait_for_text(s.path("node1.log"), "epoch 3/4", 100ms);
  }
  INFO(read_file(s.path("node0.log")) + read_file(s.path("node1.log")));
  REQUIRE(late);
  daemon->process().signal(SIGKILL);
  REQUIRE(daemon->process().wait(5s).has_value());
  daemon.reset();
  std::this_thread::sleep_for(1s);
  daemon = std::make_unique<CtrundDaemon>(daemon_flags, "127.0.0.1", port);

  for (int i = 0; i < 2; ++i) {
    const std::string log = read_file(s.path("node" + std::to_string(i) + ".log"));
    INFO("node " << i << ":\n" << log);
    CHECK(agents[i]->wait(180s) == 0);
  }
  const std::string logs = read_file(s.path("node0.log")) + read_file(s.path("node1.log"));
  INFO(logs);
  INFO(daemon->log());
  CHECK(count_of(logs, "ctrun: injecting fault ") == 2);
  CHECK(logs.find("parameters identical on all 2 rank(s)") != std::string::npos);
  CHECK(digest_of(logs) == clean_digest);  // the very parameters of the clean run
  CHECK(daemon->log().find("restored 1 job(s)") != std::string::npos);

  // ctrun status over TLS; and without the client certificate, one line saying why.
  ChildProcess status({CTRUN_PATH, "status", "--rdzv_endpoint=" + endpoint, "--rdzv_id=tls-faults",
                       "--token_file", s.path("token"), "--rdzv_conf=" + pki.rdzv_conf(pki.ca)},
                      s.path("status.log"));
  CHECK(status.wait(30s) == 0);
  CHECK(read_file(s.path("status.log")).find("tls-faults") != std::string::npos);
  ChildProcess anonymous({CTRUN_PATH, "status", "--rdzv_endpoint=" + endpoint, "--token_file",
                          s.path("token"), "--rdzv_conf=" + pki.rdzv_conf(pki.ca, false)},
                         s.path("anonymous.log"));
  CHECK(anonymous.wait(30s) == 1);
  const std::string refused = read_file(s.path("anonymous.log"));
  CHECK(refused.find("the server refused this client's certificate") != std::string::npos);
  CHECK(count_of(refused, "\n") == 1);
#endif
}

TEST_CASE("ctrund tls: an agent without TLS settings stops at once with one line") {
  ScratchDir s("ctrund_tls_plain_agent");
  TestPki pki(s.path("pki"));
  CtrundDaemon daemon(tls_flags(pki));
  const auto start = std::chrono::steady_clock::now();
  ChildProcess agent({CTRUN_PATH, "--nnodes=1", "--rdzv_backend=c10d",
                      "--rdzv_endpoint=127.0.0.1:" + std::to_string(daemon.port()),
                      "--rdzv_id=plain", TEST_WORKER_PATH, "exit", "0"},
                     s.path("agent.log"));
  const auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(code == 1);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK(log.find("this rendezvous speaks TLS only (ctrund --tls_cert): give --rdzv_conf "
                 "cacert=FILE") != std::string::npos);
}

TEST_CASE("ctrund tls: --hosts with TLS settings and no ctrund of its own is one line") {
  // The launcher would host a plain rendezvous its agents could not reach over TLS.
  ScratchDir s("ctrund_tls_hosts");
  ChildProcess launcher({CTRUN_PATH, "--hosts", "localhost", "--nproc_per_node=1",
                         "--rdzv_conf=cacert=" + s.path("ca.pem"), TEST_WORKER_PATH, "exit", "0"},
                        s.path("launcher.log"));
  const auto code = launcher.wait(30s);
  const std::string log = read_file(s.path("launcher.log"));
  INFO(log);
  CHECK(code == 2);
  CHECK(log.find("--rdzv_conf's TLS settings need a ctrund --tls_cert of its own") !=
        std::string::npos);
  CHECK(count_of(log, "\n") == 1);
}
