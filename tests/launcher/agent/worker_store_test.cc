// Real torch 1.13 workers bootstrap their process group through the agent's store, which the
// agent's rendezvous daemon serves in torch's TCPStore protocol (docs/protocol.md, the worker
// store): with env:// and with tcp:// at the launcher's own master port, on one node and two,
// and the same launch under the reference torchrun.
#include <cstdlib>

#include "catch.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// Runs each command line (a launcher and its arguments) at once and waits for all of them.
std::vector<std::optional<int>> run_all(const std::vector<std::vector<std::string>>& commands,
                                        const ScratchDir& s) {
  std::vector<std::unique_ptr<ChildProcess>> children;
  {
    SystemPython python;
    for (std::size_t i = 0; i < commands.size(); ++i) {
      children.push_back(
          std::make_unique<ChildProcess>(commands[i], s.path("node" + std::to_string(i) + ".log")));
    }
  }
  std::vector<std::optional<int>> codes;
  for (auto& c : children) codes.push_back(c->wait(120s));
  return codes;
}

std::string logs(const ScratchDir& s, std::size_t n) {
  std::string all;
  for (std::size_t i = 0; i < n; ++i) all += read_file(s.path("node" + std::to_string(i) + ".log"));
  return all;
}

// What each rank wrote (store_bootstrap.py): its world size, agent store flag and master.
void check_ranks(const ScratchDir& s, int world_size, const std::string& agent_store,
                 const std::string& master) {
  for (int rank = 0; rank < world_size; ++rank) {
    const auto seen = read_env_file(s.path("rank" + std::to_string(rank)));
    INFO("rank " << rank);
    CHECK((seen.count("world_size") == 1 && seen.at("world_size") == std::to_string(world_size)));
    CHECK((seen.count("agent_store") == 1 && seen.at("agent_store") == agent_store));
    if (!master.empty()) CHECK((seen.count("master") == 1 && seen.at("master") == master));
  }
}

}  // namespace

TEST_CASE("worker store: torch workers meet in the agent's store with env:// (--standalone)") {
  ScratchDir s("wstore");
  auto codes = run_all(
      {{CTRUN_PATH, "--standalone", "--nproc_per_node=3", STORE_SCRIPT_PATH, "env://", s.path()}},
      s);
  INFO(logs(s, 1));
  REQUIRE(codes[0] == std::optional<int>(0));
  check_ranks(s, 3, "True", "");
}

TEST_CASE(
    "worker store: tcp:// at the launcher's --master_port reaches the agent's store "
    "(static) as under torchrun") {
  ScratchDir s("wstore");
  const std::string port = std::to_string(free_port());
  auto codes =
      run_all({{CTRUN_PATH, "--nproc_per_node=2", "--master_addr=127.0.0.1",
                "--master_port=" + port, STORE_SCRIPT_PATH, "tcp://127.0.0.1:" + port, s.path()}},
              s);
  INFO(logs(s, 1));
  REQUIRE(codes[0] == std::optional<int>(0));
  check_ranks(s, 2, "True", "127.0.0.1:" + port);

  // The reference torchrun with the same command line (its store binds every interface, so it
  // runs in a loopback-only network namespace).
  if (!can_unshare_network()) {
    WARN("reference torchrun skipped: needs root for a loopback-only network namespace");
    return;
  }
  ScratchDir ref("wstore-ref");
  ChildProcess torchrun(
      {"/usr/bin/unshare", "-n", "/bin/sh", "-c",
       "ip link set lo up && /usr/bin/python3 " TORCHRUN_REF_PATH
       " --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29517 " STORE_SCRIPT_PATH
       " tcp://127.0.0.1:29517 " +
           ref.path()},
      ref.path("node0.log"));
  const auto code = torchrun.wait(120s);
  INFO(read_file(ref.path("node0.log")));
  REQUIRE(code == std::optional<int>(0));
  check_ranks(ref, 2, "True", "127.0.0.1:29517");
}

TEST_CASE("worker store: two nodes on the c10d backend meet in the hosting agent's store") {
  ScratchDir s("wstore");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::vector<std::string>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back({CTRUN_PATH, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                     "--rdzv_endpoint=" + endpoint, "--rdzv_id=wstore2", STORE_SCRIPT_PATH,
                     "env://", s.path()});
  }
  auto codes = run_all(nodes, s);
  INFO(logs(s, 2));
  REQUIRE(codes[0] == std::optional<int>(0));
  REQUIRE(codes[1] == std::optional<int>(0));
  // Workers of both nodes reach the store at the rendezvous endpoint, where one agent hosts it.
  check_ranks(s, 4, "True", endpoint);
}

TEST_CASE("worker store: with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 rank 0's worker hosts it") {
  ScratchDir s("wstore");
  ::setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1", 1);
  auto codes = run_all(
      {{CTRUN_PATH, "--standalone", "--nproc_per_node=2", STORE_SCRIPT_PATH, "env://", s.path()}},
      s);
  ::unsetenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE");
  INFO(logs(s, 1));
  REQUIRE(codes[0] == std::optional<int>(0));
  check_ranks(s, 2, "False", "");
}

TEST_CASE(
    "worker store: a ctrund with --worker_store_ports serves each job's on a port of its own") {
  ScratchDir s("wstore");
  std::unique_ptr<ChildProcess> daemon;
  const std::string endpoint =
      "127.0.0.1:" +
      std::to_string(start_ctrund(daemon, s, CTRUND_PATH, {"--worker_store_ports", "auto"}));
  std::vector<std::vector<std::string>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back({CTRUN_PATH, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                     "--rdzv_endpoint=" + endpoint, "--rdzv_conf=is_host=false",
                     "--rdzv_id=wstore-ports", STORE_SCRIPT_PATH, "env://", s.path()});
  }
  auto codes = run_all(nodes, s);
  INFO(logs(s, 2) + read_file(s.path("ctrund.log")));
  REQUIRE(codes[0] == std::optional<int>(0));
  REQUIRE(codes[1] == std::optional<int>(0));
  // Every rank met in the daemon's store for this job, on the port the daemon opened for it.
  check_ranks(s, 4, "True", "");
  const auto seen = read_env_file(s.path("rank0"));
  REQUIRE(seen.count("master") == 1);
  CHECK(seen.at("master").rfind("127.0.0.1:", 0) == 0);
  CHECK(seen.at("master") != endpoint);
  CHECK(read_file(s.path("ctrund.log")).find("job 'wstore-ports': worker store on port") !=
        std::string::npos);
}

// The failure of a large job on one address (1,024 connections per host, then a frame of ctrun's
// own protocol that torch's client read as a failed ping): an agent with default settings
// serves 4,096 ranks' bootstrap, every connection from 127.0.0.1, in either numbering. Its one
// worker plays all the ranks (store_load_worker).
TEST_CASE(
    "worker store: 4096 simulated ranks from one address bootstrap through an agent with "
    "default settings") {
  for (const std::string dialect : {"v2", "legacy"}) {
    ScratchDir s("wstore-4096");
    ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=1", STORE_LOAD_WORKER_PATH,
                        "--ranks", "4096", "--dialect", dialect},
                       s.path("node0.log"));
    const auto code = agent.wait(120s);
    const std::string log = read_file(s.path("node0.log"));
    INFO(dialect << ": " << log);
    if (log.find("need more than the open-file limit") != std::string::npos) {
      CTRUN_SKIP("4096 connections need an open-file hard limit above 4160 here");
    }
    REQUIRE(code == std::optional<int>(0));
    CHECK(log.find("4096 ranks through the barrier") != std::string::npos);
    CHECK(log.find("refused") == std::string::npos);
  }
}
