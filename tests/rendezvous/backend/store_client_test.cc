// The workers' store client (store_client.h) on both backends: one script against a ctrund
// Server in this process and against a real etcd, so a c10d store cannot tell them apart; then
// what only etcd needs: adds from many clients at once, a wait across an etcd restart, keys
// where `ctrun status` and a later job expect them.
#include "ctrun/rendezvous/store_client.h"

#include <atomic>
#include <boost/asio.hpp>
#include <set>
#include <thread>

#include "catch.h"
#include "etcd_server.h"
#include "loopback_daemon.h"
#include "process.h"
#include "rendezvous/etcd/etcd.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "run_task.h"

using namespace ctrun::rendezvous;
using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

using Steady = std::chrono::steady_clock;

StoreAddress etcd_address(const std::string& endpoints) {
  return etcd_store_address(parse_endpoint_list(endpoints).value(), "");
}

std::unique_ptr<StoreClient> connect(const StoreAddress& address, const std::string& job) {
  auto c = connect_store(address, job, 10s);
  REQUIRE(c);
  return std::move(c).value();
}

// What c10d's TCPStore does, as ctrund's store does it.
void store_script(const StoreAddress& address) {
  auto a = connect(address, "script");
  auto b = connect(address, "script");
  auto other_job = connect(address, "script-other");

  REQUIRE(a->set("k", std::string("v\0\xff", 3)));
  auto got = b->get("k", 0ms);
  REQUIRE(got);
  CHECK(got.value() == std::string("v\0\xff", 3));
  CHECK(other_job->get("k", 0ms).error().code == ErrorCode::kNotFound);
  CHECK(b->get("missing", 0ms).error().code == ErrorCode::kNotFound);
  const auto started = Steady::now();
  auto late = b->get("missing", 300ms);
  REQUIRE_FALSE(late);
  CHECK(late.error().code == ErrorCode::kTimeout);
  CHECK(Steady::now() - started >= 250ms);

  CHECK(a->add("n", 5).value() == 5);
  CHECK(b->add("n", -2).value() == 3);
  REQUIRE(a->set("text", "x"));
  CHECK(a->add("text", 1).error().code == ErrorCode::kBadRequest);

  // compareSet: absent and "" expected sets; absent and other expected answers expected;
  // a mismatch answers the current value; a match sets.
  CHECK(a->compare_set("cas", "", "one").value() == "one");
  CHECK(a->compare_set("cas", "zero", "two").value() == "one");
  CHECK(a->compare_set("cas", "one", "two").value() == "two");
  CHECK(a->compare_set("absent", "x", "y").value() == "x");
  CHECK_FALSE(b->check({"absent"}).value());
  REQUIRE(a->set("empty", ""));
  CHECK(a->compare_set("empty", "", "filled").value() == "filled");

  CHECK(b->check({"k", "n", "cas"}).value());
  CHECK_FALSE(b->check({"k", "nope"}).value());
  CHECK(b->num_keys().value() == 5);  // k, n, text, cas, empty
  CHECK(other_job->num_keys().value() == 0);
  CHECK(a->erase("text").value());
  CHECK_FALSE(a->erase("text").value());
  CHECK(b->num_keys().value() == 4);

  // A wait is woken by another client's set, long before its deadline.
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    CHECK(other_job->set("ignored", "1"));  // another job's key wakes nothing
    CHECK(a->set("w1", "1"));
    CHECK(a->set("w2", "2"));
  });
  const auto wait_started = Steady::now();
  auto waited = b->wait({"w1", "w2"}, 10s);
  setter.join();
  CHECK(waited);
  CHECK(Steady::now() - wait_started < 5s);
  auto timed_out = b->wait({"w1", "never"}, 200ms);
  REQUIRE_FALSE(timed_out);
  CHECK(timed_out.error().code == ErrorCode::kTimeout);
  CHECK(b->get("w2", 1s).value() == "2");
}

}  // namespace

TEST_CASE("store client: c10d's operations on ctrund") {
  ctrun::testing::LoopbackDaemon daemon;
  store_script(daemon.store_address());
}

TEST_CASE("store client: c10d's operations on etcd") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_store_script");
  EtcdCluster server(dir, 1);
  store_script(etcd_address(server.endpoints()));

  // The keys are under the job's prefix, where a later job under the same id wipes them.
  boost::asio::io_context io;
  etcd::ClientOptions options;
  options.endpoints = parse_endpoint_list(server.endpoints()).value();
  etcd::Client raw(io, options);
  auto found = run_task(io, raw.range(etcd_job_prefix("script") + "store/cas"));
  REQUIRE(found);
  REQUIRE(found.value().kvs.size() == 1);
  CHECK(found.value().kvs.front().value == "two");
}

TEST_CASE("store client: etcd adds from many clients at once each count once") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_store_add");
  EtcdCluster server(dir, 1);
  const StoreAddress address = etcd_address(server.endpoints());
  constexpr int kClients = 4;
  constexpr int kAdds = 25;
  std::vector<std::vector<std::int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = connect_store(address, "adders", 10s);
      if (!client) return;
      for (int i = 0; i < kAdds; ++i) {
        auto n = client.value()->add("counter", 1);
        if (n) seen[c].push_back(n.value());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::int64_t> all;
  for (const auto& s : seen) {
    CHECK(s.size() == kAdds);
    all.insert(s.begin(), s.end());
  }
  // Every add got its own number: none lost, none counted twice.
  CHECK(all.size() == kClients * kAdds);
  CHECK(*all.rbegin() == kClients * kAdds);
  auto check = connect(address, "adders");
  CHECK(check->add("counter", 0).value() == kClients * kAdds);
}

TEST_CASE("store client: an etcd wait goes on across an etcd restart") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("etcd_store_restart");
  EtcdCluster server(dir, 1);
  const StoreAddress address = etcd_address(server.endpoints());
  auto waiter = connect(address, "restart");
  auto setter = connect(address, "restart");
  std::atomic<bool> done{false};
  Status waited = ok_status();
  std::thread t([&] {
    waited = waiter->wait({"late"}, 20s);
    done = true;
  });
  std::this_thread::sleep_for(300ms);
  server.kill(0);
  std::this_thread::sleep_for(500ms);
  CHECK_FALSE(done);
  server.start(0);
  REQUIRE(setter->set("late", "here"));
  t.join();
  CHECK(waited);
}

TEST_CASE("store client: no etcd answering is an error within the timeout, not a hang") {
  StoreAddress nowhere = etcd_address("127.0.0.1:" + std::to_string(free_port()));
  auto client = connect_store(nowhere, "nowhere", 2s);
  REQUIRE(client);
  const auto started = Steady::now();
  auto got = client.value()->get("k", 1s);
  REQUIRE_FALSE(got);
  CHECK(got.error().message.find("etcd at 127.0.0.1:") != std::string::npos);
  CHECK(Steady::now() - started < 10s);
  StoreAddress empty;
  empty.backend = StoreAddress::Backend::kEtcd;
  CHECK_FALSE(connect_store(empty, "x", 1s));
}
