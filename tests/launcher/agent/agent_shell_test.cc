// The agent's shell (agent_impl.h) run whole in this process, on fakes: workers in memory
// (fake_workers.h) and the etcd backend on the memory etcd. Its decisions are the machine's
// (agent_machine_test.cc); these check that the shell carries them out: workers started with
// the round's environment, stopped and started again, failures reported, the exit code. The
// same flows with real processes: agent_test.cc and etcd_agent_test.cc.
#include <boost/asio.hpp>

#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch.h"
#include "fake_env.h"
#include "fake_workers.h"
#include "launcher/agent/agent.h"
#include "memory_etcd.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/core/rendezvous.h"
#include "rendezvous/etcd/etcd_jobs.h"

using namespace ctrun::launcher;
using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// One agent on the fakes; the test's own nodes may join the same memory etcd.
struct InMemoryAgent {
  asio::io_context io;
  std::shared_ptr<MemoryEtcd> etcd = MemoryEtcd::create(io);
  std::shared_ptr<WorkerScript> workers = std::make_shared<WorkerScript>();

  // ctrun's command line (after "ctrun"), on this test's etcd; the agent's exit code.
  int run(std::vector<std::string> args, int local_world_size) {
    args.insert(args.begin(), {"--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:2379"});
    auto parsed = parse_launch_options(args, env_of({}));
    REQUIRE(parsed.ok());
    AgentWorld world;
    world.make_workers = [this](asio::io_context& on) {
      return std::make_unique<FakeWorkers>(on, workers);
    };
    world.make_backend = [this](asio::io_context& on, rdzv::BackendSpec spec) {
      spec.connect_kv = [this](const rdzv::etcd::ClientOptions& o) { return etcd->connect(o); };
      return rdzv::make_backend(on, std::move(spec));
    };
    world.adopt_orphans = false;
    // Bounded: a stuck agent is stopped as a user would stop it, and the test fails on it.
    asio::steady_timer watchdog(io, 30s);
    bool stuck = false;
    watchdog.async_wait([&stuck](boost::system::error_code ec) {
      if (ec) return;
      stuck = true;
      std::raise(SIGTERM);
    });
    Agent agent(io, parsed.value().options, local_world_size, std::move(world));
    const int code = agent.run();
    watchdog.cancel();
    CHECK_FALSE(stuck);
    return code;
  }

  // A second node, "other" (one of at most two, 2 workers), joins `job` on the loop, reports
  // success once in a round, then calls `then` with its join's answer.
  void second_node_joins(const std::string& job,
                         std::function<void(const rdzv::Result<rdzv::RoundAssignment>&)> then) {
    rdzv::BackendSpec o;
    o.service = rdzv::BackendSpec::Service::kEtcd;
    o.endpoints = {rdzv::Endpoint{"127.0.0.1", 2379}};
    o.job = job;
    o.connect_kv = [this](const rdzv::etcd::ClientOptions& c) { return etcd->connect(c); };
    other = rdzv::make_etcd_backend(io, o);
    // Made here, not as a temporary in co_await's operand, which g++ 12 miscompiles.
    const rdzv::NodeInfo node{"other", "127.0.0.2", 2, 0, -1};
    asio::co_spawn(
        io,
        [this, node, then = std::move(then)]() -> rdzv::Task<void> {
          if (auto s = co_await other->connect(); !s) co_return;
          other->start_keep_alive(1s, 3);
          rdzv::RendezvousConfig config;
          config.min_nodes = 1;
          config.max_nodes = 2;
          config.last_call_timeout = 0s;
          auto joined = co_await other->join(node, config);
          const std::string no_message;  // (no temporary in co_await's operand either)
          if (joined) co_await other->report(true, no_message);
          then(joined);
        },
        asio::detached);
  }
  std::unique_ptr<rdzv::Backend> other;  // second_node_joins()'s

  // The job's state as etcd holds it; its end reason is kept in end_reason.
  rdzv::JobState state(const std::string& job) {
    io.restart();
    auto kv = etcd->connect();
    std::optional<rdzv::Result<rdzv::etcd::RangeResult>> read;
    asio::co_spawn(io, kv->range("/ctrun/" + job + "/rendezvous"),
                   [&read](std::exception_ptr, rdzv::Result<rdzv::etcd::RangeResult> r) {
                     read = std::move(r);
                   });
    io.run_for(1s);
    REQUIRE(read.has_value());
    REQUIRE(read->ok());
    REQUIRE(read->value().kvs.size() == 1);
    rdzv::ManualClock clock;
    auto saved = rdzv::etcd_restore_state(read->value().kvs.front(), clock);
    REQUIRE(saved.ok());
    end_reason = saved.value()->end_reason();
    return saved.value()->state();
  }
  std::string end_reason;
};

std::vector<std::string> values(const std::vector<WorkerSpec>& attempt, const std::string& name) {
  std::vector<std::string> out;
  for (const auto& spec : attempt) out.push_back(env_value(spec, name));
  return out;
}

}  // namespace

TEST_CASE("agent in memory: a failed worker within the budget restarts the group, then succeeds") {
  InMemoryAgent a;
  a.workers->on_start = [](FakeWorkers& w, int attempt) {
    if (attempt == 0) {
      w.exit(1, 1);  // rank 1 fails; rank 0 is stopped by the restart
    } else {
      w.exit(0, 0);
      w.exit(1, 0);
    }
  };
  const int code = a.run({"--nnodes=1", "--nproc_per_node=2", "--max_restarts=1",
                          "--rdzv_id=restarts", "--monitor_interval=0.1", "train.py"},
                         2);
  CHECK(code == 0);
  REQUIRE(a.workers->attempts.size() == 2);
  for (const auto& attempt : a.workers->attempts) {
    CHECK(values(attempt, "RANK") == std::vector<std::string>{"0", "1"});
    CHECK(values(attempt, "WORLD_SIZE") == std::vector<std::string>{"2", "2"});
    CHECK(values(attempt, "TORCHELASTIC_RUN_ID") ==
          std::vector<std::string>{"restarts", "restarts"});
  }
  CHECK(values(a.workers->attempts[0], "TORCHELASTIC_RESTART_COUNT") ==
        std::vector<std::string>{"0", "0"});
  CHECK(values(a.workers->attempts[1], "TORCHELASTIC_RESTART_COUNT") ==
        std::vector<std::string>{"1", "1"});
  CHECK(a.workers->stop_signals == std::vector<int>{SIGTERM});  // the restart's stop
  CHECK(a.state("restarts") == rdzv::JobState::kSucceeded);
}

TEST_CASE("agent in memory: past the budget the failure is reported and the agent exits 1") {
  InMemoryAgent a;
  a.workers->on_start = [](FakeWorkers& w, int) { w.exit(0, 3); };
  const int code = a.run({"--nnodes=1", "--nproc_per_node=2", "--max_restarts=0",
                          "--rdzv_id=budget", "--monitor_interval=0.1", "train.py"},
                         2);
  CHECK(code == 1);
  CHECK(a.workers->attempts.size() == 1);
  CHECK(a.state("budget") == rdzv::JobState::kFailed);
  INFO(a.end_reason);
  CHECK(a.end_reason.find("rank 0 on ") != std::string::npos);
  CHECK(a.end_reason.find("exit code 3") != std::string::npos);
}

TEST_CASE(
    "agent in memory: a node that joins reopens the round, and the workers start again wider") {
  InMemoryAgent a;
  std::optional<rdzv::Result<rdzv::RoundAssignment>> other_joined;
  a.workers->on_start = [&](FakeWorkers& w, int attempt) {
    if (attempt == 0) {
      // A second node comes while the first round runs.
      a.second_node_joins("grow", [&](const auto& joined) { other_joined = joined; });
    } else {
      w.exit(0, 0);
      w.exit(1, 0);
    }
  };
  const int code =
      a.run({"--nnodes=1:2", "--nproc_per_node=2", "--max_restarts=0", "--rdzv_id=grow",
             "--rdzv_conf=last_call_timeout=0", "--monitor_interval=0.1", "train.py"},
            2);
  CHECK(code == 0);
  REQUIRE(other_joined.has_value());
  REQUIRE(other_joined->ok());
  CHECK(other_joined->value().round == 1);
  REQUIRE(a.workers->attempts.size() == 2);
  CHECK(values(a.workers->attempts[0], "WORLD_SIZE") == std::vector<std::string>{"2", "2"});
  CHECK(values(a.workers->attempts[1], "WORLD_SIZE") == std::vector<std::string>{"4", "4"});
  CHECK(values(a.workers->attempts[1], "GROUP_WORLD_SIZE") == std::vector<std::string>{"2", "2"});
  // A membership change is not a failure: the budget of 0 restarts is untouched.
  CHECK(a.workers->stop_signals == std::vector<int>{SIGTERM});
  CHECK(a.state("grow") == rdzv::JobState::kSucceeded);
}

TEST_CASE("agent in memory, fault tolerant: a failed worker is replaced alone, the other runs on") {
  InMemoryAgent a;
  a.workers->on_start = [](FakeWorkers& w, int) { w.exit(1, 1); };
  a.workers->on_restart = [](FakeWorkers& w, int local_rank, int generation) {
    CHECK(local_rank == 1);
    CHECK(generation == 1);
    w.exit(0, 0);
    w.exit(1, 0);
  };
  const int code = a.run({"--nnodes=1", "--nproc_per_node=2", "--max_restarts=2",
                          "--fault_tolerance=step", "--rdzv_id=ft", "train.py"},
                         2);
  CHECK(code == 0);
  CHECK(a.workers->attempts.size() == 1);    // the group was never started again
  CHECK(a.workers->stop_signals.empty());    // nobody was stopped
  REQUIRE(a.workers->restarts.size() == 1);  // only rank 1 was
  const WorkerSpec& again = a.workers->restarts.front();
  CHECK(again.local_rank == 1);
  CHECK(env_value(again, "TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(env_value(again, "CTRUN_FAULT_TOLERANCE") == "step");
  const std::string replica = env_value(again, "CTRUN_REPLICA_ID");
  CHECK(replica == env_value(a.workers->attempts[0][1], "CTRUN_REPLICA_ID"));  // its slot
  CHECK(replica.size() > 2);
  CHECK(replica.substr(replica.size() - 2) == "/1");
  // A Python worker's way to the quorum: the agent's own executable (`ctrun worker-proxy`), and
  // ctrun_worker.py on its path.
  CHECK_FALSE(env_value(again, "CTRUN_WORKER_PROXY").empty());
  CHECK(env_value(again, "PYTHONPATH").find("/python") != std::string::npos);
  CHECK(a.state("ft") == rdzv::JobState::kSucceeded);
}

TEST_CASE("agent in memory, fault tolerant: a node that joins does not stop the workers") {
  InMemoryAgent a;
  bool other_in = false;
  a.workers->on_start = [&](FakeWorkers& w, int) {
    a.second_node_joins("ft-grow", [&](const auto& joined) {
      other_in = joined.ok();
      // The first node's workers finish their training.
      w.exit(0, 0);
      w.exit(1, 0);
    });
  };
  const int code =
      a.run({"--nnodes=1:2", "--nproc_per_node=2", "--max_restarts=0", "--fault_tolerance=step",
             "--rdzv_id=ft-grow", "--rdzv_conf=last_call_timeout=0", "train.py"},
            2);
  CHECK(code == 0);
  CHECK(other_in);
  CHECK(a.workers->attempts.size() == 1);
  CHECK(a.workers->stop_signals.empty());
  CHECK(a.workers->restarts.empty());
  CHECK(a.state("ft-grow") == rdzv::JobState::kSucceeded);
}
