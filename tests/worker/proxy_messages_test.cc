// The Python workers' proxy (`ctrun worker-proxy`): its JSON lines decoded and answered in memory
// (store requests against a fake StoreClient, quorum answers with their plan), and the proxy
// serving a worker over pipes against a ctrund in this process (LoopbackDaemon). Python workers
// under ctrun: tests/launcher/agent/python_fault_tolerance_test.cc.
#include "worker_runtime/quorum/proxy_messages.h"

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "catch.h"
#include "fake_env.h"
#include "loopback_daemon.h"
#include "worker_runtime/quorum/worker_proxy.h"

using namespace ctrun::worker;
using namespace std::chrono_literals;
using ctrun::testing::env_of;
using ctrun::testing::LoopbackDaemon;
namespace rdzv = ctrun::rendezvous;
using rdzv::Json;

namespace {

// A store in memory; get and wait of a missing key time out at once.
class FakeStore : public rdzv::StoreClient {
 public:
  rdzv::Status set(const std::string& key, const std::string& value) override {
    kv[key] = value;
    return rdzv::ok_status();
  }
  rdzv::Result<std::string> get(const std::string& key,
                                std::optional<rdzv::Duration> timeout) override {
    last_timeout = timeout;
    auto it = kv.find(key);
    if (it == kv.end()) return rdzv::Error{rdzv::ErrorCode::kTimeout, "no key " + key};
    return it->second;
  }
  rdzv::Result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    const std::int64_t v = (kv.count(key) ? std::stoll(kv[key]) : 0) + delta;
    kv[key] = std::to_string(v);
    return v;
  }
  rdzv::Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) override {
    auto it = kv.find(key);
    if (it == kv.end() ? expected.empty() : it->second == expected) kv[key] = desired;
    return kv.count(key) ? kv[key] : expected;
  }
  rdzv::Result<bool> check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) {
      if (!kv.count(k)) return false;
    }
    return true;
  }
  rdzv::Status wait(const std::vector<std::string>& keys,
                    std::optional<rdzv::Duration> timeout) override {
    last_timeout = timeout;
    for (const auto& k : keys) {
      if (!kv.count(k)) return rdzv::Error{rdzv::ErrorCode::kTimeout, "no key " + k};
    }
    return rdzv::ok_status();
  }
  rdzv::Result<bool> erase(const std::string& key) override { return kv.erase(key) > 0; }
  rdzv::Result<std::int64_t> num_keys() override { return static_cast<std::int64_t>(kv.size()); }

  std::map<std::string, std::string> kv;
  std::optional<rdzv::Duration> last_timeout;
};

Json answer(FakeStore& store, const Json& request) {
  auto parsed = parse_proxy_request(request.dump());
  REQUIRE(parsed.ok());
  auto a = answer_store_request(store, parsed.value());
  if (!a) return Json{{"error", a.error().message}};
  return a.value();
}

}  // namespace

TEST_CASE("worker proxy: a request line is checked, the error names what is wrong") {
  for (const char* line : {"", "not json", "[1]", R"({"op":"get"})", R"({"id":"1","op":"get"})",
                           R"({"id":1,"op":7})"}) {
    INFO(line);
    auto r = parse_proxy_request(line);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message ==
          "a request must be a JSON object with an integer 'id' and a string 'op'");
  }
  auto unknown = parse_proxy_request(R"({"id":1,"op":"shutdown"})");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message == "unknown op 'shutdown'");
  auto ok = parse_proxy_request(R"({"id":42,"op":"quorum","committed":3})");
  REQUIRE(ok.ok());
  CHECK(ok.value().id == 42);
  CHECK_FALSE(is_store_op(ok.value().op));
  CHECK(is_store_op("compare_set"));

  CHECK(Json::parse(proxy_reply(7, Json{{"value", "00ff"}})) ==
        Json{{"id", 7}, {"ok", true}, {"value", "00ff"}});
  CHECK(Json::parse(proxy_error(8, {rdzv::ErrorCode::kTimeout, "late"})) ==
        Json{{"id", 8}, {"ok", false}, {"code", "timeout"}, {"error", "late"}});
}

TEST_CASE("worker proxy: store requests keep bytes exact, and name a bad field") {
  FakeStore store;
  const std::string bytes("\x00\xff\n{\"k", 6);
  CHECK(to_hex(bytes) == "00ff0a7b226b");
  CHECK(from_hex("00FF0a7b226b").value() == bytes);
  CHECK(from_hex("abc").error().message == "hex of odd length 3");
  CHECK(from_hex("zz").error().message == "not hex at offset 0");

  CHECK(answer(store, {{"id", 1}, {"op", "set"}, {"key", "q/1/a"}, {"value", to_hex(bytes)}}) ==
        Json::object());
  CHECK(store.kv.at("q/1/a") == bytes);
  CHECK(answer(store, {{"id", 2}, {"op", "get"}, {"key", "q/1/a"}, {"timeout_ms", 1500}}) ==
        Json{{"value", to_hex(bytes)}});
  CHECK(store.last_timeout == rdzv::Duration(1500ms));
  // No timeout, or a negative one: wait as long as the store is reachable.
  (void)answer(store, {{"id", 3}, {"op", "get"}, {"key", "q/1/a"}, {"timeout_ms", -1}});
  CHECK_FALSE(store.last_timeout.has_value());
  CHECK(answer(store, {{"id", 4}, {"op", "get"}, {"key", "missing"}, {"timeout_ms", 0}}) ==
        Json{{"error", "no key missing"}});
  CHECK(answer(store, {{"id", 5}, {"op", "add"}, {"key", "n"}, {"delta", 5}}) ==
        Json{{"value", 5}});
  CHECK(answer(store, {{"id", 6}, {"op", "add"}, {"key", "n"}, {"delta", -2}}) ==
        Json{{"value", 3}});
  CHECK(answer(store, {{"id", 7},
                       {"op", "compare_set"},
                       {"key", "c"},
                       {"expected", ""},
                       {"desired", to_hex("x")}}) == Json{{"value", to_hex("x")}});
  CHECK(answer(store, {{"id", 8}, {"op", "check"}, {"keys", {"c", "n"}}}) == Json{{"ready", true}});
  CHECK(answer(store, {{"id", 9}, {"op", "check"}, {"keys", {"c", "none"}}}) ==
        Json{{"ready", false}});
  CHECK(answer(store, {{"id", 10}, {"op", "wait"}, {"keys", {"c"}}, {"timeout_ms", 10}}) ==
        Json::object());
  CHECK(answer(store, {{"id", 11}, {"op", "delete"}, {"key", "c"}}) == Json{{"deleted", true}});
  CHECK(answer(store, {{"id", 12}, {"op", "num_keys"}}) == Json{{"count", 2}});

  CHECK(answer(store, {{"id", 13}, {"op", "set"}, {"key", 5}, {"value", ""}}) ==
        Json{{"error", "the request's 'key' must be a string"}});
  CHECK(answer(store, {{"id", 14}, {"op", "set"}, {"key", "k"}, {"value", "0g"}}) ==
        Json{{"error", "the request's 'value': not hex at offset 0"}});
  CHECK(answer(store, {{"id", 15}, {"op", "add"}, {"key", "k"}, {"delta", "1"}}) ==
        Json{{"error", "the request's 'delta' must be an integer"}});
  CHECK(answer(store, {{"id", 16}, {"op", "wait"}, {"keys", "k"}}) ==
        Json{{"error", "the request's 'keys' must be a list"}});
}

TEST_CASE("worker proxy: a quorum's answer carries its plan, the same rules as the C++ runtime") {
  rdzv::QuorumAssignment a;
  a.quorum_id = 4;
  a.members = {{"n/0", 10, ""}, {"n/1", 10, ""}, {"n/2", 0, ""}};
  a.rank = 2;
  a.max_step = 10;
  a.heal_from = 0;
  a.store_prefix = "quorum/1/4/";
  auto j = proxy_quorum_answer(a);
  REQUIRE(j.ok());
  CHECK(j.value()["quorum"]["store_prefix"] == "quorum/1/4/");
  CHECK(j.value()["quorum"]["members"][2]["replica"] == "n/2");
  const Json& plan = j.value()["plan"];
  CHECK(plan["rank"] == 2);
  CHECK(plan["size"] == 3);
  CHECK(plan["step"] == 10);
  CHECK(plan["trainers"] == Json{0, 1, 2});
  CHECK(plan["heal_from"] == Json{nullptr, nullptr, 0});  // the one behind takes rank 0's

  rdzv::QuorumAssignment done;
  done.members = {{"n/2", 0, ""}};
  done.max_step = 96;
  done.finished = true;
  auto f = proxy_quorum_answer(done);
  REQUIRE(f.ok());
  CHECK(f.value()["quorum"]["finished"] == true);
  CHECK(f.value()["plan"]["rank"].is_null());
  CHECK(f.value()["plan"]["step"] == 96);

  auto config = proxy_quorum_config(Json{{"config",
                                          {{"min_replicas", 2},
                                           {"max_replicas", 3},
                                           {"join_timeout_ms", 3000},
                                           {"heartbeat_timeout_ms", 500}}}});
  REQUIRE(config.ok());
  CHECK(config.value().min_replicas == 2);
  CHECK(config.value().join_timeout == rdzv::Duration(3000ms));
  auto missing = proxy_quorum_config(Json{{"config", {{"min_replicas", 1}}}});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message == "config: the request's 'max_replicas' must be an integer");
}

TEST_CASE("worker proxy: serves a worker over pipes, against ctrund") {
  LoopbackDaemon daemon;
  const auto vars = ctrun::testing::fault_tolerant_worker_vars(daemon.port(), "n/0", "py-job");
  int requests[2];
  int answers[2];
  REQUIRE(::pipe2(requests, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(answers, O_CLOEXEC) == 0);
  int status = -1;
  std::thread proxy([&] { status = run_worker_proxy(env_of(vars), requests[0], answers[1]); });
  auto say = [&](const Json& request) {
    const std::string line = request.dump() + "\n";
    REQUIRE(::write(requests[1], line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  };
  std::string pending;
  auto hear = [&]() -> Json {
    for (;;) {
      const auto end = pending.find('\n');
      if (end != std::string::npos) {
        Json j = Json::parse(pending.substr(0, end));
        pending.erase(0, end + 1);
        return j;
      }
      char buffer[4096];
      const ssize_t n = ::read(answers[0], buffer, sizeof buffer);
      REQUIRE(n > 0);
      pending.append(buffer, static_cast<std::size_t>(n));
    }
  };
  say({{"id", 1}, {"op", "quorum"}, {"committed", 0}});
  CHECK(
      hear() ==
      Json{{"id", 1}, {"ok", false}, {"code", "bad_request"}, {"error", "quorum: connect first"}});
  // A mistyped field is an error answer; the proxy serves on.
  say({{"id", 20}, {"op", "connect"}, {"timeout_ms", "soon"}, {"config", Json::object()}});
  const Json mistyped = hear();
  CHECK(mistyped["id"] == 20);
  CHECK(mistyped["ok"] == false);
  CHECK(mistyped["code"] == "bad_request");
  say({{"id", 2},
       {"op", "connect"},
       {"timeout_ms", 5000},
       {"config",
        {{"min_replicas", 1},
         {"max_replicas", 1},
         {"join_timeout_ms", 2000},
         {"heartbeat_timeout_ms", 1000}}}});
  CHECK(hear() == Json{{"id", 2}, {"ok", true}});
  say({{"id", 3}, {"op", "quorum"}, {"committed", 0}, {"rebuild", true}, {"timeout_ms", 5000}});
  const Json q = hear();
  INFO(q.dump());
  CHECK(q["ok"] == true);
  CHECK(q["plan"]["rank"] == 0);
  CHECK(q["plan"]["size"] == 1);
  CHECK_FALSE(q["quorum"]["store_prefix"].get<std::string>().empty());
  // The store: a value with every byte, through the job's store on ctrund and back.
  std::string all_bytes;
  for (int c = 0; c < 256; ++c) all_bytes.push_back(static_cast<char>(c));
  say({{"id", 4}, {"op", "set"}, {"key", "k"}, {"value", to_hex(all_bytes)}});
  CHECK(hear() == Json{{"id", 4}, {"ok", true}});
  say({{"id", 5}, {"op", "get"}, {"key", "k"}, {"timeout_ms", 1000}});
  CHECK(hear() == Json{{"id", 5}, {"ok", true}, {"value", to_hex(all_bytes)}});
  say({{"id", 6}, {"op", "finish"}, {"step", 0}, {"timeout_ms", 5000}});
  CHECK(hear() == Json{{"id", 6}, {"ok", true}});
  ::close(requests[1]);  // the worker is gone: the proxy stops serving
  proxy.join();
  CHECK(status == 0);
  ::close(requests[0]);
  ::close(answers[0]);
  ::close(answers[1]);
}

TEST_CASE("worker proxy: a worker without the mode gets one line and status 2") {
  int status = -1;
  std::thread proxy([&] { status = run_worker_proxy(env_of({{"RANK", "0"}}), 0, 1); });
  proxy.join();
  CHECK(status == 2);
}
