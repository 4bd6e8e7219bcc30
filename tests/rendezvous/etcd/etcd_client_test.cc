// The etcd gateway client against real etcd (Debian's etcd-server) on loopback ports.
#include "rendezvous/etcd/etcd_client.h"

#include <boost/asio.hpp>
#include <catch2/catch.hpp>
#include <optional>

#include "etcd_server.h"
#include "process.h"
#include "run_task.h"

using namespace ctrun::rendezvous;
using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace etcd = ctrun::rendezvous::etcd;

namespace {

template <typename T>
T run(boost::asio::io_context& io, etcd::Task<T> task, std::chrono::milliseconds limit = 20s) {
  return run_task(io, std::move(task), limit);
}

etcd::ClientOptions options_for(const std::string& endpoints) {
  etcd::ClientOptions o;
  o.endpoints = etcd::parse_endpoints(endpoints).value();
  o.request_timeout = 10s;
  o.attempt_timeout = 2s;
  return o;
}

bool has_key(boost::asio::io_context& io, etcd::Client& c, const std::string& key) {
  auto r = run(io, c.range(key));
  REQUIRE(r.ok());
  return !r.value().kvs.empty();
}

}  // namespace

TEST_CASE("etcd client: put, range, create-if-absent and compare-and-swap, delete") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_kv");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));

  auto rev = run(io, c.put("/t/a", std::string("bytes\0\xff", 7)));
  REQUIRE(rev.ok());
  REQUIRE(run(io, c.put("/t/b", "")).ok());
  auto all = run(io, c.range("/t/", etcd::prefix_end("/t/")));
  REQUIRE(all.ok());
  REQUIRE(all.value().kvs.size() == 2);
  CHECK(all.value().kvs[0].value == std::string("bytes\0\xff", 7));
  CHECK(all.value().kvs[0].mod_revision == rev.value());
  CHECK(all.value().kvs[1].value.empty());

  // Create-if-absent: only the first of two wins; the loser reads the winner's value.
  auto create = [](const std::string& value) {
    etcd::Txn t;
    t.compare.push_back(
        {"/t/owner", etcd::Compare::Target::kCreate, etcd::Compare::Result::kEqual, 0, ""});
    t.success.push_back({etcd::Operation::Kind::kPut, "/t/owner", value, "", 0});
    t.failure.push_back({etcd::Operation::Kind::kRange, "/t/owner", "", "", 0});
    return t;
  };
  auto first = run(io, c.txn(create("one")));
  REQUIRE(first.ok());
  CHECK(first.value().succeeded);
  auto second = run(io, c.txn(create("two")));
  REQUIRE(second.ok());
  CHECK_FALSE(second.value().succeeded);
  REQUIRE(second.value().ranges.size() == 1);
  CHECK(second.value().ranges[0].kvs[0].value == "one");

  // Compare-and-swap on the revision that was read.
  const std::int64_t seen = second.value().ranges[0].kvs[0].mod_revision;
  auto cas = [&](std::int64_t rev_seen, const std::string& value) {
    etcd::Txn t;
    t.compare.push_back(
        {"/t/owner", etcd::Compare::Target::kMod, etcd::Compare::Result::kEqual, rev_seen, ""});
    t.success.push_back({etcd::Operation::Kind::kPut, "/t/owner", value, "", 0});
    return t;
  };
  auto swapped = run(io, c.txn(cas(seen, "three")));
  REQUIRE(swapped.ok());
  CHECK(swapped.value().succeeded);
  auto stale = run(io, c.txn(cas(seen, "four")));
  REQUIRE(stale.ok());
  CHECK_FALSE(stale.value().succeeded);

  auto deleted = run(io, c.erase("/t/", etcd::prefix_end("/t/")));
  REQUIRE(deleted.ok());
  CHECK(deleted.value() == 3);
  CHECK_FALSE(has_key(io, c, "/t/owner"));

  // etcd's own refusal comes back as an error naming it.
  auto bad = run(io, c.put("", "x"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code == ErrorCode::kBadRequest);
  CHECK(bad.error().message == "etcd: etcdserver: key is not provided");
}

TEST_CASE("etcd client: a leased key lives while kept alive and vanishes when not, or at revoke") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_lease");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));

  auto lease = run(io, c.grant(2));
  REQUIRE(lease.ok());
  CHECK(lease.value().ttl == 2);
  REQUIRE(run(io, c.put("/l/node", "alive", lease.value().id)).ok());
  for (int i = 0; i < 6; ++i) {  // 3 s of keep-alives, past the TTL
    std::this_thread::sleep_for(500ms);
    auto ttl = run(io, c.keep_alive(lease.value().id));
    REQUIRE(ttl.ok());
    CHECK(ttl.value() == 2);
  }
  CHECK(has_key(io, c, "/l/node"));
  const auto stopped = std::chrono::steady_clock::now();
  while (has_key(io, c, "/l/node") && std::chrono::steady_clock::now() - stopped < 10s) {
    std::this_thread::sleep_for(100ms);
  }
  CHECK_FALSE(has_key(io, c, "/l/node"));  // TTL 2 s: gone well before the 10 s bound
  auto gone = run(io, c.keep_alive(lease.value().id));
  REQUIRE(gone.ok());
  CHECK(gone.value() == 0);

  auto second = run(io, c.grant(60));
  REQUIRE(second.ok());
  REQUIRE(run(io, c.put("/l/other", "x", second.value().id)).ok());
  REQUIRE(run(io, c.revoke(second.value().id)).ok());
  CHECK_FALSE(has_key(io, c, "/l/other"));
  auto again = run(io, c.revoke(second.value().id));
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == ErrorCode::kNotFound);
}

TEST_CASE("etcd client: a watch sees puts and deletes from its start revision; cancel ends it") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_watch");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));
  auto before = run(io, c.put("/w/early", "1"));  // before the watch starts: replayed
  REQUIRE(before.ok());

  std::vector<etcd::WatchEvent> events;
  bool created = false;
  std::optional<Status> ended;
  boost::asio::co_spawn(io,
                        c.watch("/w/", etcd::prefix_end("/w/"), before.value(),
                                [&](const etcd::WatchMessage& m) {
                                  created = created || m.created;
                                  events.insert(events.end(), m.events.begin(), m.events.end());
                                }),
                        [&](std::exception_ptr, Status s) { ended = s; });
  auto wait_for = [&](std::size_t n) {
    io.restart();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (events.size() < n && std::chrono::steady_clock::now() < deadline) io.run_for(10ms);
    return events.size() >= n;
  };
  REQUIRE(wait_for(1));
  CHECK(created);
  REQUIRE(run(io, c.put("/w/a", "2")).ok());
  REQUIRE(run(io, c.put("/elsewhere", "x")).ok());
  REQUIRE(run(io, c.erase("/w/a")).ok());
  REQUIRE(wait_for(3));
  CHECK(events[0].kv.key == "/w/early");
  CHECK(events[1].kv.key == "/w/a");
  CHECK(events[1].kv.value == "2");
  CHECK_FALSE(events[1].deleted);
  CHECK(events[2].deleted);
  CHECK(events.size() == 3);

  c.cancel_watches();
  io.restart();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!ended && std::chrono::steady_clock::now() < deadline) io.run_for(10ms);
  REQUIRE(ended.has_value());
  CHECK(ended->ok());
}

TEST_CASE("etcd client: members tried in turn; a killed member is skipped, none left is an error") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_members");
  EtcdCluster cluster(dir, 3);
  boost::asio::io_context io;
  // A dead address first: the client moves on to the members.
  const std::string endpoints =
      "127.0.0.1:" + std::to_string(free_port()) + "," + cluster.endpoints();
  etcd::Client c(io, options_for(endpoints));
  REQUIRE(run(io, c.put("/m/k", "v")).ok());

  cluster.kill(0);  // the member that answered
  auto after = run(io, c.range("/m/k"));
  REQUIRE(after.ok());
  CHECK(after.value().kvs.at(0).value == "v");
  REQUIRE(run(io, c.put("/m/k", "w")).ok());

  cluster.kill(1);
  cluster.kill(2);
  etcd::ClientOptions quick = options_for(endpoints);
  quick.request_timeout = 1500ms;
  quick.attempt_timeout = 500ms;
  etcd::Client lonely(io, quick);
  const auto start = std::chrono::steady_clock::now();
  auto none = run(io, lonely.put("/m/k", "x"));
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code == ErrorCode::kConnection);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}
