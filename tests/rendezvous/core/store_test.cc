#include "rendezvous/core/store.h"

#include "catch.h"

using namespace ctrun::rendezvous;
using namespace std::chrono_literals;

TEST_CASE("store: set, find, erase and num_keys") {
  KeyValueStore store;
  REQUIRE(store.set("a", std::string("x\0y", 3)));
  REQUIRE(store.find("a") != nullptr);
  CHECK(*store.find("a") == std::string("x\0y", 3));  // values are bytes
  CHECK(store.find("b") == nullptr);
  CHECK(store.num_keys() == 1);
  REQUIRE(store.set("a", "z"));
  CHECK(*store.find("a") == "z");
  CHECK(store.num_keys() == 1);
  CHECK(store.erase("a"));
  CHECK_FALSE(store.erase("a"));
  CHECK(store.num_keys() == 0);
  CHECK(store.total_bytes() == 0);
}

TEST_CASE("store: add keeps a decimal counter as TCPStore does") {
  KeyValueStore store;
  CHECK(store.add("n", 5).value() == 5);
  CHECK(store.add("n", -7).value() == -2);
  CHECK(*store.find("n") == "-2");
  REQUIRE(store.set("text", "abc"));
  auto bad = store.add("text", 1);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == ErrorCode::kBadRequest);
  CHECK(*store.find("text") == "abc");  // untouched
  REQUIRE(store.set("big", std::to_string(INT64_MAX)));
  auto overflow = store.add("big", 1);
  REQUIRE_FALSE(overflow);
  CHECK(overflow.error().message.find("overflow") != std::string::npos);
}

TEST_CASE("store: compare_set follows TCPStore") {
  KeyValueStore store;
  // Absent key, non-empty expected: nothing set, expected returned.
  CHECK(store.compare_set("k", "old", "new").value() == "old");
  CHECK(store.find("k") == nullptr);
  // Absent key, empty expected: set.
  CHECK(store.compare_set("k", "", "v1").value() == "v1");
  CHECK(*store.find("k") == "v1");
  // Match: swapped.
  CHECK(store.compare_set("k", "v1", "v2").value() == "v2");
  // Mismatch: current returned, unchanged.
  CHECK(store.compare_set("k", "zzz", "v3").value() == "v2");
  CHECK(*store.find("k") == "v2");
}

TEST_CASE("store: limits give clear errors and change nothing") {
  StoreLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_keys = 2;
  limits.max_total_bytes = 40;
  KeyValueStore store(limits);
  auto long_key = store.set("123456789", "v");
  REQUIRE_FALSE(long_key);
  CHECK(long_key.error().code == ErrorCode::kLimit);
  auto big_value = store.set("k", std::string(17, 'x'));
  REQUIRE_FALSE(big_value);
  CHECK(big_value.error().code == ErrorCode::kLimit);
  REQUIRE(store.set("a", "1"));
  REQUIRE(store.set("b", "2"));
  auto third = store.set("c", "3");
  REQUIRE_FALSE(third);
  CHECK(third.error().message.find("maximum of 2 keys") != std::string::npos);
  REQUIRE(store.set("a", std::string(16, 'x')));      // replacing is fine
  auto total = store.set("b", std::string(16, 'y'));  // 1+16 + 1+16 = 34 <= 40, fine
  REQUIRE(total);
  StoreLimits tight = limits;
  tight.max_total_bytes = 20;
  KeyValueStore small(tight);
  REQUIRE(small.set("a", std::string(16, 'x')));
  auto over = small.set("b", std::string(16, 'x'));
  REQUIRE_FALSE(over);
  CHECK(small.num_keys() == 1);
}

TEST_CASE("store: multi_set is all or nothing") {
  StoreLimits limits;
  limits.max_key_bytes = 4;
  KeyValueStore store(limits);
  auto mismatch = store.multi_set({"a", "b"}, {"1"});
  REQUIRE_FALSE(mismatch);
  CHECK(mismatch.error().code == ErrorCode::kBadRequest);
  auto bad = store.multi_set({"a", "toolong"}, {"1", "2"});
  REQUIRE_FALSE(bad);
  CHECK(store.num_keys() == 0);
  REQUIRE(store.multi_set({"a", "b"}, {"1", "2"}));
  CHECK(*store.find("b") == "2");
  CHECK(store.check({"a", "b"}));
  CHECK_FALSE(store.check({"a", "c"}));
}

TEST_CASE("store: wait runs at once when the keys exist") {
  KeyValueStore store;
  REQUIRE(store.set("a", "1"));
  int calls = 0;
  auto id = store.wait({"a"}, TimePoint::max(), [&](Status s) {
    CHECK(s.ok());
    ++calls;
  });
  CHECK(id == 0);
  CHECK(calls == 1);
  CHECK(store.num_waiters() == 0);
}

TEST_CASE("store: wait fires when the last key appears, once") {
  KeyValueStore store;
  int calls = 0;
  store.wait({"a", "b"}, TimePoint::max(), [&](Status s) {
    CHECK(s.ok());
    ++calls;
  });
  REQUIRE(store.set("a", "1"));
  CHECK(calls == 0);
  REQUIRE(store.set("b", "2"));
  CHECK(calls == 1);
  REQUIRE(store.set("b", "3"));
  CHECK(calls == 1);
  CHECK(store.num_waiters() == 0);
}

TEST_CASE("store: a key deleted while waiting must come back") {
  KeyValueStore store;
  REQUIRE(store.set("a", "1"));
  int calls = 0;
  store.wait({"a", "b"}, TimePoint::max(), [&](Status) { ++calls; });
  CHECK(store.erase("a"));
  REQUIRE(store.set("b", "2"));
  CHECK(calls == 0);
  REQUIRE(store.set("a", "again"));
  CHECK(calls == 1);
}

TEST_CASE("store: add and compare_set wake waiters too") {
  KeyValueStore store;
  int calls = 0;
  store.wait({"n"}, TimePoint::max(), [&](Status) { ++calls; });
  store.wait({"c"}, TimePoint::max(), [&](Status) { ++calls; });
  REQUIRE(store.add("n", 1));
  REQUIRE(store.compare_set("c", "", "x"));
  CHECK(calls == 2);
}

TEST_CASE("store: waits time out at their deadline, in order") {
  ManualClock clock;
  KeyValueStore store;
  std::vector<std::string> fired;
  store.wait({"x"}, clock.now() + 2s, [&](Status s) {
    CHECK(s.error().code == ErrorCode::kTimeout);
    fired.push_back("2s");
  });
  store.wait({"x"}, clock.now() + 1s, [&](Status s) {
    CHECK_FALSE(s.ok());
    fired.push_back("1s");
  });
  REQUIRE(store.next_deadline() == clock.now() + 1s);
  clock.advance(999ms);
  store.expire(clock.now());
  CHECK(fired.empty());
  clock.advance(5s);
  store.expire(clock.now());
  CHECK(fired == std::vector<std::string>{"1s", "2s"});
  CHECK_FALSE(store.next_deadline());
  REQUIRE(store.set("x", "late"));  // nobody left to wake
  CHECK(fired.size() == 2);
}

TEST_CASE("store: a cancelled wait never fires") {
  ManualClock clock;
  KeyValueStore store;
  int calls = 0;
  auto id = store.wait({"x"}, clock.now() + 1s, [&](Status) { ++calls; });
  store.cancel(id);
  REQUIRE(store.set("x", "1"));
  clock.advance(2s);
  store.expire(clock.now());
  CHECK(calls == 0);
  CHECK(store.num_waiters() == 0);
}

TEST_CASE("store: many waiters on one key all wake (compare_set race)") {
  KeyValueStore store;
  int woke = 0;
  for (int i = 0; i < 100; ++i) store.wait({"leader"}, TimePoint::max(), [&](Status) { ++woke; });
  // Two contenders race to become leader: exactly one wins, both see the same winner.
  auto first = store.compare_set("leader", "", "node-a");
  auto second = store.compare_set("leader", "", "node-b");
  CHECK(first.value() == "node-a");
  CHECK(second.value() == "node-a");
  CHECK(woke == 100);
}

TEST_CASE("store: multi_set with a key named twice keeps the last value and exact limits") {
  StoreLimits limits;
  limits.max_keys = 1;
  KeyValueStore store(limits);
  REQUIRE(store.multi_set({"k", "k"}, {"first", "second"}));  // one key, not two
  CHECK(*store.find("k") == "second");
  CHECK(store.num_keys() == 1);
  CHECK(store.total_bytes() == 1 + 6);
}
