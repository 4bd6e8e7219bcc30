// The worker's side of the per-step quorum: what CTRUN_FAULT_TOLERANCE and CTRUN_REPLICA_ID
// must say, and StepQuorum against a ctrund in this process (LoopbackDaemon). Both backends'
// quorums: tests/rendezvous/backend/quorum_client_test.cc.
#include "ctrun/worker/step_quorum.h"

#include "catch.h"

#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "fake_env.h"
#include "loopback_daemon.h"

using namespace ctrun::worker;
using namespace std::chrono_literals;
using ctrun::testing::env_of;
using ctrun::testing::LoopbackDaemon;
namespace rdzv = ctrun::rendezvous;

namespace {

std::map<std::string, std::string> worker_vars(std::uint16_t port, const std::string& replica) {
  return ctrun::testing::fault_tolerant_worker_vars(port, replica, "ft-job");
}

rdzv::QuorumConfig three_replicas() {
  rdzv::QuorumConfig c;
  c.max_replicas = 3;
  c.join_timeout = 5s;
  return c;
}

}  // namespace

TEST_CASE("worker env: CTRUN_FAULT_TOLERANCE and CTRUN_REPLICA_ID are read and checked") {
  auto ft = read_worker_env(env_of(worker_vars(29400, "node-a/1")));
  REQUIRE(ft.ok());
  CHECK(ft.value().fault_tolerant);
  CHECK(ft.value().replica_id == "node-a/1");

  auto vars = worker_vars(29400, "");
  auto missing = read_worker_env(env_of(vars));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message.rfind("CTRUN_REPLICA_ID: expected 1 to 256 bytes", 0) == 0);
  vars = worker_vars(29400, "r");
  vars["CTRUN_FAULT_TOLERANCE"] = "always";
  auto bad_mode = read_worker_env(env_of(vars));
  REQUIRE_FALSE(bad_mode.ok());
  CHECK(bad_mode.error().message == "CTRUN_FAULT_TOLERANCE: expected step or none, got 'always'");
  vars.erase("CTRUN_FAULT_TOLERANCE");
  CHECK_FALSE(read_worker_env(env_of(vars)).value().fault_tolerant);

  // Without the mode there is no quorum to ask: said, not attempted.
  auto plain = StepQuorum::connect(read_worker_env(env_of(vars)).value(), three_replicas(), 1s);
  REQUIRE_FALSE(plain.ok());
  CHECK(plain.error().message.find("--fault_tolerance=step") != std::string::npos);
  // On etcd the replicas keep the quorum themselves: nothing is called before the first ask
  // (tests/rendezvous/backend/quorum_client_test.cc asks).
  auto on_etcd = worker_vars(2379, "r");
  on_etcd["CTRUN_STORE_BACKEND"] = "etcd";
  on_etcd["CTRUN_STORE_ADDR"] = "127.0.0.1:2379";
  auto etcd = StepQuorum::connect(read_worker_env(env_of(on_etcd)).value(), three_replicas(), 1s);
  CHECK(etcd.ok());
}

TEST_CASE("step quorum: three workers form each step's quorum, a dead one is not waited for") {
  LoopbackDaemon daemon;
  std::vector<std::unique_ptr<StepQuorum>> workers;
  for (const char* replica : {"n/0", "n/1", "n/2"}) {
    auto env = read_worker_env(env_of(worker_vars(daemon.port(), replica)));
    REQUIRE(env.ok());
    auto q = StepQuorum::connect(env.value(), three_replicas(), 5s);
    REQUIRE(q.ok());
    workers.push_back(std::move(q).value());
  }
  // Each worker asks from a thread of its own, as each process would.
  auto step = [&](std::int64_t committed, std::size_t count) {
    std::vector<std::optional<Result<rdzv::QuorumAssignment>>> got(count);
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < count; ++i) {
      threads.emplace_back([&, i] { got[i] = workers[i]->next(committed, "addr", 10s); });
    }
    for (auto& t : threads) t.join();
    return got;
  };
  auto first = step(0, 3);
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(first[i]->ok());
    CHECK(first[i]->value().rank == static_cast<int>(i));
    CHECK(first[i]->value().members.at(i).replica_id == workers[i]->replica_id());
  }
  CHECK(workers[0]->heartbeat().ok());
  workers[2].reset();  // its process died: the connection closed
  const auto start = std::chrono::steady_clock::now();
  auto second = step(1, 2);
  CHECK(std::chrono::steady_clock::now() - start < 2s);  // the join timeout is 5 s
  REQUIRE(second[0]->ok());
  CHECK(second[0]->value().quorum_id == first[0]->value().quorum_id + 1);
  CHECK(second[0]->value().members.size() == 2);
  CHECK(second[0]->value().max_step == 1);
}
