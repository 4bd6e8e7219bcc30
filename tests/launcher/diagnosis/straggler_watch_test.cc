// The straggler watch of two nodes in memory: one event loop, a map as the job's store, steps
// that advance with the clock. Node 0 judges both nodes' rates and both name the slow rank; a
// node whose workers ended says so once, so that its last rates are not judged on.
#include "launcher/diagnosis/straggler_watch.h"

#include <boost/asio.hpp>
#include <chrono>
#include <map>

#include "catch.h"
#include "rendezvous/protocol/step_keys.h"

using namespace ctrun::launcher;
namespace rdzv = ctrun::rendezvous;
using namespace std::chrono_literals;

namespace {

struct Node {
  std::vector<std::string> lines;
  std::vector<std::string> events;
  bool running = true;
  std::shared_ptr<StragglerWatch> watch;
};

}  // namespace

TEST_CASE("straggler watch: node 0 judges every node's rates and each node names the slow rank") {
  boost::asio::io_context io;
  std::map<std::string, std::string> store;
  const auto start = std::chrono::steady_clock::now();
  // Ranks 0-2 step every 20 ms, rank 3 (node 1's local rank 1) every 80 ms.
  auto step_of = [start](int rank) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    return static_cast<std::int64_t>(ms / (rank == 3 ? 80 : 20));
  };
  StragglerSettings settings;
  settings.factor = 2;
  settings.window = 10;
  settings.interval = 200ms;
  std::vector<Node> nodes(2);
  for (int n = 0; n < 2; ++n) {
    Node& node = nodes[n];
    StragglerWatch::Hooks hooks;
    hooks.running = [&node](int) { return node.running; };
    hooks.progress = [n, step_of](int local_rank) -> std::optional<HeartbeatFiles::Progress> {
      return HeartbeatFiles::Progress{step_of(2 * n + local_rank), std::nullopt};
    };
    hooks.set = [&store](std::string key, std::string value) -> rdzv::Task<rdzv::Status> {
      store[key] = value;
      co_return rdzv::ok_status();
    };
    hooks.get = [&store](std::string key) -> rdzv::Task<rdzv::Result<std::string>> {
      auto it = store.find(key);
      if (it == store.end()) co_return rdzv::Error{rdzv::ErrorCode::kNotFound, key + " not set"};
      co_return it->second;
    };
    hooks.log = [&node](const std::string& line) { node.lines.push_back(line); };
    hooks.event = [&node](const std::string& name, rdzv::Json) { node.events.push_back(name); };
    node.watch = std::make_shared<StragglerWatch>(io.get_executor(), settings, std::move(hooks));
    rdzv::RoundAssignment round;
    round.round = 4;
    round.group_rank = n;
    round.group_world_size = 2;
    round.rank_offset = 2 * n;
    round.world_size = 4;
    round.store_prefix = "rdzv/0/4/";
    node.watch->workers_started(round, 2, "h" + std::to_string(n));
  }
  const auto named = [&] { return !nodes[0].lines.empty() && !nodes[1].lines.empty(); };
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!named() && std::chrono::steady_clock::now() < until) io.run_for(50ms);
  REQUIRE(named());
  for (const auto& node : nodes) {
    INFO(node.lines.front());
    CHECK(node.lines.front().find("rank 3 on h1 is ") == 0);
    CHECK(node.lines.front().find("x slower than the median for the last ") != std::string::npos);
    CHECK(node.events == std::vector<std::string>{"straggler"});
  }
  const auto verdict = step_verdict_from_json(rdzv::Json::parse(store.at(rdzv::kStragglersKey)));
  REQUIRE(verdict.ok());
  CHECK(verdict.value().round == 4);
  CHECK(verdict.value().stragglers == std::vector<int>{3});
  CHECK(verdict.value().ranks.size() == 4);

  // Node 1's workers end: it publishes its empty rates once, and node 0 judges without them.
  nodes[1].running = false;
  const std::string key = std::string("rdzv/0/4/") + rdzv::kStepRatesPrefix + "1";
  const auto empty = [&] {
    auto rates = node_rates_from_json(rdzv::Json::parse(store.at(key)));
    return rates.ok() && rates.value().empty();
  };
  const auto later = std::chrono::steady_clock::now() + 10s;
  while (!empty() && std::chrono::steady_clock::now() < later) io.run_for(50ms);
  REQUIRE(empty());
  io.run_for(500ms);
  // Two ranks left: a verdict of node 0's alone, nobody slow among them.
  const auto after = step_verdict_from_json(rdzv::Json::parse(store.at(rdzv::kStragglersKey)));
  REQUIRE(after.ok());
  CHECK(after.value().ranks.size() == 2);
  CHECK(after.value().stragglers.empty());
  for (auto& node : nodes) node.watch->workers_stopped();
  io.run_for(300ms);  // the loops end
}
