// etcd's key-value operations as ctrun uses them, each test run twice: through the gateway
// Client against a real etcd (Debian's etcd-server) on loopback ports, and against the memory
// etcd the backend tests use (memory_etcd.h). The same assertions hold for both, which is what
// keeps the fake honest.
#include "rendezvous/etcd/etcd_client.h"

#include <boost/asio.hpp>
#include <optional>
#include <thread>

#include "catch.h"
#include "etcd_server.h"
#include "memory_etcd.h"
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
  o.endpoints = parse_endpoint_list(endpoints).value();
  o.request_timeout = 10s;
  o.attempt_timeout = 2s;
  return o;
}

bool has_key(boost::asio::io_context& io, etcd::Kv& c, const std::string& key) {
  auto r = run(io, c.range(key));
  REQUIRE(r.ok());
  return !r.value().kvs.empty();
}

void check_put_range_txn_delete(boost::asio::io_context& io, etcd::Kv& c) {
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

  // A key written twice in one transaction is refused as a whole.
  etcd::Txn twice;
  twice.success.push_back(etcd::put_op("/t/x", "1"));
  twice.success.push_back(etcd::delete_op("/t/", etcd::prefix_end("/t/")));
  auto refused = run(io, c.txn(twice));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == ErrorCode::kBadRequest);
  CHECK(refused.error().message == "etcd: etcdserver: duplicate key given in txn request");
  CHECK_FALSE(has_key(io, c, "/t/x"));
}

}  // namespace

TEST_CASE("etcd client: put, range, create-if-absent and compare-and-swap, delete") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_kv");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));
  check_put_range_txn_delete(io, c);
}

TEST_CASE("memory etcd: put, range, create-if-absent and compare-and-swap, delete") {
  boost::asio::io_context io;
  auto c = MemoryEtcd::create(io)->connect();
  check_put_range_txn_delete(io, *c);
}

namespace {

void check_leases(boost::asio::io_context& io, etcd::Kv& c) {
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
  auto unknown = run(io, c.put("/l/late", "x", second.value().id));
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().code == ErrorCode::kNotFound);

  auto third = run(io, c.grant(30));
  REQUIRE(third.ok());
  auto left = run(io, c.time_to_live(third.value().id));
  REQUIRE(left.ok());
  CHECK(left.value().granted_ttl == 30);
  CHECK(left.value().ttl > 25);
  CHECK(left.value().ttl <= 30);
  CHECK(run(io, c.time_to_live(second.value().id)).value().ttl == -1);
}

}  // namespace

TEST_CASE("etcd client: a leased key lives while kept alive and vanishes when not, or at revoke") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_lease");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));
  check_leases(io, c);
}

TEST_CASE("memory etcd: a leased key lives while kept alive and vanishes when not, or at revoke") {
  boost::asio::io_context io;
  auto c = MemoryEtcd::create(io)->connect();
  check_leases(io, *c);
}

namespace {

// The keys a join's turn counts: those changed before a revision, no values, at most a few.
void check_older_keys(boost::asio::io_context& io, etcd::Kv& c) {
  std::vector<std::int64_t> revisions;
  for (int i = 1; i <= 5; ++i) {
    auto put = run(io, c.put("/o/" + std::to_string(i), "value"));
    REQUIRE(put.ok());
    revisions.push_back(put.value());
  }
  auto older = [&](std::int64_t before, std::int64_t limit) {
    etcd::Txn txn;
    txn.success.push_back(etcd::older_keys_op("/o/", before, limit));
    auto read = run(io, c.txn(txn));
    REQUIRE(read.ok());
    REQUIRE(read.value().ranges.size() == 1);
    std::vector<std::string> keys;
    for (const auto& kv : read.value().ranges[0].kvs) {
      CHECK(kv.value.empty());
      keys.push_back(kv.key);
    }
    return keys;
  };
  CHECK(older(revisions[3], 10) == std::vector<std::string>{"/o/1", "/o/2", "/o/3"});
  CHECK(older(revisions[3], 2) == std::vector<std::string>{"/o/1", "/o/2"});
  CHECK(older(revisions[0], 2).empty());
}

}  // namespace

TEST_CASE("etcd client: a range of the keys older than a revision, keys only, limited") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_older");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));
  check_older_keys(io, c);
}

TEST_CASE("memory etcd: a range of the keys older than a revision, keys only, limited") {
  boost::asio::io_context io;
  auto c = MemoryEtcd::create(io)->connect();
  check_older_keys(io, *c);
}

namespace {

void check_watch(boost::asio::io_context& io, etcd::Kv& c) {
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
  // The same range, deletions only (etcd's NOPUT filter): neither put reaches it.
  std::vector<etcd::WatchEvent> deletions;
  std::optional<Status> deletions_ended;
  boost::asio::co_spawn(io,
                        c.watch(
                            "/w/", etcd::prefix_end("/w/"), before.value(),
                            [&](const etcd::WatchMessage& m) {
                              deletions.insert(deletions.end(), m.events.begin(), m.events.end());
                            },
                            etcd::WatchEvents::kDeletesOnly),
                        [&](std::exception_ptr, Status s) { deletions_ended = s; });
  auto wait_for = [&](std::size_t n, std::size_t deleted = 0) {
    io.restart();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((events.size() < n || deletions.size() < deleted) &&
           std::chrono::steady_clock::now() < deadline) {
      io.run_for(10ms);
    }
    return events.size() >= n && deletions.size() >= deleted;
  };
  REQUIRE(wait_for(1));
  CHECK(created);
  REQUIRE(run(io, c.put("/w/a", "2")).ok());
  REQUIRE(run(io, c.put("/elsewhere", "x")).ok());
  REQUIRE(run(io, c.erase("/w/a")).ok());
  REQUIRE(wait_for(3, 1));
  CHECK(events[0].kv.key == "/w/early");
  CHECK(events[1].kv.key == "/w/a");
  CHECK(events[1].kv.value == "2");
  CHECK_FALSE(events[1].deleted);
  CHECK(events[2].deleted);
  CHECK(events.size() == 3);
  REQUIRE(deletions.size() == 1);
  CHECK(deletions[0].deleted);
  CHECK(deletions[0].kv.key == "/w/a");

  c.cancel_watches();
  io.restart();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while ((!ended || !deletions_ended) && std::chrono::steady_clock::now() < deadline) {
    io.run_for(10ms);
  }
  REQUIRE(ended.has_value());
  CHECK(ended->ok());
  REQUIRE(deletions_ended.has_value());
  CHECK(deletions_ended->ok());
}

}  // namespace

TEST_CASE(
    "etcd client: a watch sees puts and deletes from its start revision, or only the deletes "
    "when filtered, cancel ends it") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_watch");
  EtcdCluster server(dir, 1);
  boost::asio::io_context io;
  etcd::Client c(io, options_for(server.endpoints()));
  check_watch(io, c);
}

TEST_CASE(
    "memory etcd: a watch sees puts and deletes from its start revision, or only the deletes "
    "when filtered, cancel ends it") {
  boost::asio::io_context io;
  auto c = MemoryEtcd::create(io)->connect();
  check_watch(io, *c);
}

TEST_CASE(
    "memory etcd: stopped, calls fail after their timeout and watches end, started, leases "
    "renewed") {
  boost::asio::io_context io;
  auto etcd = MemoryEtcd::create(io);
  etcd::ClientOptions quick;
  quick.request_timeout = 300ms;
  auto c = etcd->connect(quick);
  auto lease = run(io, c->grant(2));
  REQUIRE(lease.ok());
  REQUIRE(run(io, c->put("/s/node", "up", lease.value().id)).ok());
  std::optional<Status> ended;
  boost::asio::co_spawn(io, c->watch("/s/", etcd::prefix_end("/s/"), 0, [](const auto&) {}),
                        [&](std::exception_ptr, Status s) { ended = s; });
  io.restart();
  io.run_for(50ms);
  REQUIRE_FALSE(ended.has_value());

  etcd->set_available(false);
  io.restart();
  io.run_for(50ms);
  REQUIRE(ended.has_value());
  CHECK(ended->error().code == ErrorCode::kConnection);
  const auto start = std::chrono::steady_clock::now();
  int retries = 0;
  auto refused = run(io, c->grant(2, 200ms, [&](const Error&) { ++retries; }));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == ErrorCode::kConnection);
  CHECK(retries >= 2);
  CHECK(std::chrono::steady_clock::now() - start >= 200ms);
  CHECK_FALSE(run(io, c->range("/s/node")).ok());

  std::this_thread::sleep_for(2500ms);  // past the TTL, while stopped: the lease is kept
  etcd->set_available(true);
  CHECK(has_key(io, *c, "/s/node"));
  CHECK(etcd->leases() == 1);
}

TEST_CASE("etcd client: members tried in turn, a killed member is skipped, none left is an error") {
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

TEST_CASE("etcd client: as a user, a token that ran out is asked for again") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("etcd_client_auth");
  // Tokens that expire after 1 s without use.
  EtcdCluster etcd(s, 1, "auth", std::nullopt, {"--auth-token-ttl=1"});
  REQUIRE(etcd.enable_auth("bob", "bobpw", "/t/") == "");

  boost::asio::io_context io;
  auto o = options_for(etcd.endpoints());
  o.user = "bob";
  o.password = "bobpw";
  etcd::Client c(io, o);
  REQUIRE(run(io, c.put("/t/x", "1")).ok());
  std::this_thread::sleep_for(2500ms);  // the token is gone
  REQUIRE(run(io, c.put("/t/x", "2")).ok());
  auto r = run(io, c.range("/t/x"));
  REQUIRE(r.ok());
  REQUIRE(r.value().kvs.size() == 1);
  CHECK(r.value().kvs[0].value == "2");
  // Outside its role: one line, the user named.
  auto denied = run(io, c.put("/elsewhere", "1"));
  REQUIRE_FALSE(denied.ok());
  CHECK(denied.error().message ==
        "etcd: user 'bob': permission denied (its roles must grant read and write on the job's "
        "keys)");
  // A wrong password: etcd's reason, the user named, the password nowhere.
  o.password = "nope";
  etcd::Client wrong(io, o);
  auto refused = run(io, wrong.put("/t/x", "3"));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message ==
        "etcd: user 'bob': etcdserver: authentication failed, invalid user ID or password");
}
