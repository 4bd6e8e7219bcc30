// A replica's background thread (worker_runtime/quorum/background_asker.h): its overlapped ask
// is answered like a direct one, and between asks its heartbeats keep the replica in the
// quorum through a gap longer than the heartbeat timeout; and QuorumAsker, which it drives,
// against a ctrund in this process (LoopbackDaemon).
#include "worker_runtime/quorum/background_asker.h"

#include <thread>
#include <vector>

#include "catch.h"
#include "fake_env.h"
#include "loopback_daemon.h"

using namespace ctrun::worker;
using namespace std::chrono_literals;
using ctrun::testing::env_of;
using ctrun::testing::LoopbackDaemon;
namespace rdzv = ctrun::rendezvous;

namespace {

std::unique_ptr<QuorumAsker> replica(std::uint16_t port, const std::string& id,
                                     const rdzv::QuorumConfig& config) {
  auto env =
      read_worker_env(env_of(ctrun::testing::fault_tolerant_worker_vars(port, id, "bg-job")));
  REQUIRE(env.ok());
  auto asker = QuorumAsker::connect(env.value(), config, 5s);
  REQUIRE(asker.ok());
  return std::move(asker).value();
}

}  // namespace

TEST_CASE("background asker: answers like a direct ask, and its beats keep the replica in") {
  LoopbackDaemon daemon;
  rdzv::QuorumConfig config;
  config.max_replicas = 3;
  config.join_timeout = 5s;
  config.heartbeat_timeout = 400ms;
  auto a = replica(daemon.port(), "n/0", config);
  auto b = replica(daemon.port(), "n/1", config);
  auto c = replica(daemon.port(), "n/2", config);
  BackgroundAsker background(*a, 10s);

  // The first quorum: a asks through its thread, b and c directly.
  auto a_first = background.ask(0);
  std::vector<rdzv::Result<rdzv::QuorumAssignment>> direct(2);
  std::thread tb([&] { direct[0] = b->ask(0, true, 10s); });
  std::thread tc([&] { direct[1] = c->ask(0, true, 10s); });
  tb.join();
  tc.join();
  REQUIRE(a_first.wait_for(10s) == std::future_status::ready);
  auto first = a_first.get();
  REQUIRE(first.ok());
  REQUIRE(direct[0].ok());
  CHECK(first.value().members.size() == 3);
  CHECK(first.value().quorum_id == direct[0].value().quorum_id);

  // b and c ask for the next step while a stays silent for 1.5 s, almost four heartbeat
  // timeouts: its thread's beats keep it alive, so the quorum waits for it and takes it in.
  // (Without them a would be dead after 0.4 s and b and c would form a quorum of two.)
  std::thread tb2([&] { direct[0] = b->ask(1, false, 10s); });
  std::thread tc2([&] { direct[1] = c->ask(1, false, 10s); });
  std::this_thread::sleep_for(1500ms);
  auto a_second = background.ask(1);
  tb2.join();
  tc2.join();
  REQUIRE(a_second.wait_for(10s) == std::future_status::ready);
  auto second = a_second.get();
  REQUIRE(second.ok());
  REQUIRE(direct[0].ok());
  CHECK(direct[0].value().members.size() == 3);
  CHECK(second.value().members.size() == 3);
  CHECK(second.value().quorum_id == direct[0].value().quorum_id);
}
