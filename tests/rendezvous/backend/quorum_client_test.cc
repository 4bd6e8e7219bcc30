// The workers' quorum client (quorum_client.h) on both backends: one script against a ctrund
// Server in this process and against a real etcd, so a fault-tolerant worker cannot tell them
// apart; then what only etcd has: a replica that dies without leaving is let go when its lease
// expires.
#include "ctrun/rendezvous/quorum_client.h"

#include <boost/asio.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "catch.h"
#include "etcd_server.h"
#include "loopback_daemon.h"
#include "process.h"
#include "rendezvous/etcd/etcd.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_quorum.h"
#include "run_task.h"

using namespace ctrun::rendezvous;
using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

using Steady = std::chrono::steady_clock;

QuorumConfig three_replicas() {
  QuorumConfig c;
  c.min_replicas = 1;
  c.max_replicas = 3;
  c.join_timeout = 5s;
  c.heartbeat_timeout = 1s;
  return c;
}

std::unique_ptr<QuorumClient> connect(const StoreAddress& address, const std::string& job,
                                      const std::string& replica) {
  auto c = connect_quorum(address, job, replica, 10s);
  REQUIRE(c);
  return std::move(c).value();
}

// Each replica asks from a thread of its own, as each worker process would: clients[who[i]]
// asks as replica "r<who[i]>" with steps[i] (or steps[0] for all).
std::vector<Result<QuorumAssignment>> ask_together(
    std::vector<std::unique_ptr<QuorumClient>>& clients, const std::vector<std::size_t>& who,
    const std::vector<std::int64_t>& steps, const QuorumConfig& config, Duration timeout = 20s) {
  std::vector<std::optional<Result<QuorumAssignment>>> got(who.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < who.size(); ++i) {
    threads.emplace_back([&, i] {
      QuorumRequest r;
      const std::int64_t step = steps.size() == who.size() ? steps[i] : steps[0];
      r.member = QuorumMember{"r" + std::to_string(who[i]), step, "addr" + std::to_string(who[i])};
      r.config = config;
      got[i] = clients[who[i]]->quorum(r, timeout);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<Result<QuorumAssignment>> out;
  for (auto& g : got) out.push_back(std::move(*g));
  return out;
}

void quorum_script(const StoreAddress& address, const std::string& job) {
  std::vector<std::unique_ptr<QuorumClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(connect(address, job, "r" + std::to_string(i)));
  const QuorumConfig config = three_replicas();

  // The first quorum forms once the job's three replicas asked; ranks follow the replica ids.
  auto first = ask_together(clients, {0, 1, 2}, {0}, config);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("replica " << i);
    REQUIRE(first[i]);
    CHECK(first[i].value().rank == static_cast<int>(i));
    CHECK(first[i].value().members.size() == 3);
    CHECK(first[i].value().quorum_id == first[0].value().quorum_id);
    CHECK(first[i].value().store_prefix == first[0].value().store_prefix);
    CHECK_FALSE(first[i].value().heal_from.has_value());
  }
  // Steady state: the same members keep the id; one behind heals from an up-to-date one.
  auto second = ask_together(clients, {0, 1, 2}, {1}, config);
  REQUIRE(second[0]);
  CHECK(second[0].value().quorum_id == first[0].value().quorum_id);
  auto third = ask_together(clients, {0, 1, 2}, {2, 2, 1}, config);
  REQUIRE(third[2]);
  CHECK(third[2].value().max_step == 2);
  CHECK(third[2].value().heal_from == 0);
  CHECK(clients[0]->quorum_heartbeat("r0", 5s));

  // r2 goes (its connection closes, its lease is revoked): not waited for the join timeout.
  clients[2].reset();
  const auto started = Steady::now();
  auto shrunk = ask_together(clients, {0, 1}, {3}, config);
  CHECK(Steady::now() - started < 2s);
  REQUIRE(shrunk[0]);
  REQUIRE(shrunk[1]);
  CHECK(shrunk[0].value().members.size() == 2);
  CHECK(shrunk[0].value().quorum_id == first[0].value().quorum_id + 1);
  CHECK(shrunk[0].value().store_prefix != first[0].value().store_prefix);

  // Alone, r0 is not a majority of the last quorum (r0, r1), however long it asks.
  auto alone = ask_together(clients, {0}, {4}, config, 1500ms);
  REQUIRE_FALSE(alone[0]);
  CHECK(alone[0].error().code == ErrorCode::kTimeout);

  // r1 finishes the training at step 4: r0's ask learns it at once.
  QuorumRequest done;
  done.member = QuorumMember{"r1", 4, ""};
  done.config = config;
  done.finished = true;
  auto finished = clients[1]->quorum(done, 5s);
  REQUIRE(finished);
  CHECK(finished.value().finished);
  auto after = ask_together(clients, {0}, {4}, config, 5s);
  REQUIRE(after[0]);
  CHECK(after[0].value().finished);
  CHECK(after[0].value().max_step == 4);
}

}  // namespace

TEST_CASE("quorum client: ctrund forms each step's quorum as the script expects") {
  LoopbackDaemon daemon;
  quorum_script(daemon.store_address(), "quorum-script");
}

TEST_CASE("quorum client: etcd forms each step's quorum as ctrund does") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("quorum_etcd");
  EtcdCluster etcd(dir, 1);
  quorum_script(etcd_store_address(parse_endpoint_list(etcd.endpoints()).value(), ""),
                "quorum-script");
}

TEST_CASE("quorum client: on etcd a replica that dies without leaving goes with its lease") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("quorum_etcd_lease");
  EtcdCluster etcd(dir, 1);
  const auto address = etcd_store_address(parse_endpoint_list(etcd.endpoints()).value(), "");
  std::vector<std::unique_ptr<QuorumClient>> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(connect(address, "lease", "r" + std::to_string(i)));
  // r2 asks through an EtcdQuorum of its own that is dropped without leave(): as a worker
  // SIGKILLed, its lease stays until it expires.
  boost::asio::io_context io;
  etcd::ClientOptions options;
  options.endpoints = address.etcd_endpoints;
  etcd::Client kv(io, options);
  SteadyClock clock;
  auto dead = std::make_unique<EtcdQuorum>(kv, "lease", "r2", clock);
  const QuorumConfig config = three_replicas();
  std::optional<Result<QuorumAssignment>> dead_answer;
  std::thread dead_thread([&] {
    QuorumRequest r;
    r.member = QuorumMember{"r2", 0, ""};
    r.config = config;
    dead_answer = run_task(io, dead->ask(r, 20s));
  });
  auto first = ask_together(clients, {0, 1}, {0}, config);
  dead_thread.join();
  REQUIRE(first[0]);
  REQUIRE(*dead_answer);
  CHECK(first[0].value().members.size() == 3);
  dead.reset();

  const auto started = Steady::now();
  auto second = ask_together(clients, {0, 1}, {1}, config);
  const auto took = Steady::now() - started;
  REQUIRE(second[0]);
  CHECK(second[0].value().members.size() == 2);
  // Not before the lease's TTL (the 1 s heartbeat timeout; etcd may grant up to a few seconds
  // more), and well before the 5 s join timeout would have let it go.
  CHECK(took >= 900ms);
  CHECK(took < 4900ms);
  WARN("a dead replica's lease let it go after "
       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
}
