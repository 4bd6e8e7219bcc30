// The worker store: torch's TCPStore clients and ctrun's own on one listener, in memory.
#include <cstring>
#include <memory>
#include <vector>

#include "catch.h"
#include "memory_state_log.h"
#include "rendezvous/protocol/tcpstore_wire.h"
#include "service_harness.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;
using namespace ctrun::rendezvous::tcpstore;
using namespace std::chrono_literals;

namespace {

ServiceOptions serving_worker_store(const std::string& job = "job") {
  ServiceOptions options;
  options.worker_store_job = job;
  return options;
}

// One TCPStore client of either numbering, speaking through the harness.
class TcpStoreClient {
 public:
  TcpStoreClient(ServiceHarness& h, Dialect dialect) : h_(h), dialect_(dialect) {
    id_ = h.connect("10.0.0.9");
    h.transport.raw.insert(id_);
    if (dialect == Dialect::kValidated) h.send_raw(id_, encode_validate());
  }
  void send(Request r) { h_.send_raw(id_, encode_request(dialect_, r)); }
  std::string answer() { return h_.transport.take_raw(id_); }
  bool closed() const { return h_.transport.closed.count(id_) != 0; }
  ConnectionId id() const { return id_; }

  void set(const std::string& k, const std::string& v) { send({Op::kSet, {k}, {v}, 0, 0}); }
  std::int64_t add(const std::string& k, std::int64_t d) {
    send({Op::kAdd, {k}, {}, d, 0});
    return i64(answer());
  }
  std::string get(const std::string& k) {
    send({Op::kGet, {k}, {}, 0, 0});
    return bytes(answer());
  }

  static std::int64_t i64(const std::string& a) {
    REQUIRE(a.size() == 8);
    std::int64_t v = 0;
    std::memcpy(&v, a.data(), 8);
    return v;
  }
  static std::string bytes(const std::string& a) {
    REQUIRE(a.size() >= 8);
    std::uint64_t n = 0;
    std::memcpy(&n, a.data(), 8);
    REQUIRE(a.size() == 8 + n);
    return a.substr(8);
  }

 private:
  ServiceHarness& h_;
  Dialect dialect_;
  ConnectionId id_ = 0;
};

std::string u8(std::uint8_t v) { return std::string(1, static_cast<char>(v)); }

}  // namespace

TEST_CASE("worker store: ctrun's clients say the preamble, the daemon then challenges") {
  ServiceHarness h(serving_worker_store());
  const ConnectionId id = h.connect();
  CHECK_FALSE(h.transport.has(id));  // waits to learn who connected
  h.send_raw(id, std::string(kClientPreamble.substr(0, 2)));
  CHECK_FALSE(h.transport.has(id));
  h.send_raw(id, std::string(kClientPreamble.substr(2)));
  Json answer = h.hello(id, "job");
  CHECK(answer["ok"] == true);
  CHECK(answer["worker_store"] == true);  // what the agents read to set USE_AGENT_STORE

  // Another job on the same daemon is not told so.
  const ConnectionId other = h.connect();
  h.send_raw(other, std::string(kClientPreamble));
  CHECK_FALSE(h.hello(other, "other").contains("worker_store"));
}

TEST_CASE(
    "worker store: a daemon that does not serve it challenges at once and passes over the "
    "preamble") {
  ServiceHarness h;
  const ConnectionId old_client = h.connect();
  CHECK(h.transport.has(old_client));  // a client without the preamble still works
  CHECK(h.hello(old_client, "job")["ok"] == true);
  const ConnectionId new_client = h.connect();
  h.send_raw(new_client, std::string(kClientPreamble));
  Json answer = h.hello(new_client, "job");
  CHECK(answer["ok"] == true);
  CHECK_FALSE(answer.contains("worker_store"));
}

TEST_CASE("worker store: torch 1.13's client (init key, set, wait, get, check, delete, num_keys)") {
  ServiceHarness h(serving_worker_store());
  TcpStoreClient a(h, Dialect::kLegacy);
  TcpStoreClient b(h, Dialect::kLegacy);
  CHECK(a.add("init/", 1) == 1);
  CHECK(b.add("init/", 1) == 2);

  // b waits for a key a sets later.
  b.send({Op::kWait, {"//worker/attempt_0/addr"}, {}, 0, 0});
  CHECK(b.answer().empty());
  a.set("//worker/attempt_0/addr", "10.0.0.1:1234");
  CHECK(b.answer() == u8(kStopWaiting));
  CHECK(b.get("//worker/attempt_0/addr") == "10.0.0.1:1234");

  a.send({Op::kCheck, {"//worker/attempt_0/addr", "missing"}, {}, 0, 0});
  CHECK(a.answer() == u8(kCheckNotReady));
  a.send({Op::kCheck, {"//worker/attempt_0/addr"}, {}, 0, 0});
  CHECK(a.answer() == u8(kCheckReady));
  a.send({Op::kCompareSet, {"cas"}, {"", "first"}, 0, 0});
  CHECK(TcpStoreClient::bytes(a.answer()) == "first");
  a.send({Op::kCompareSet, {"cas"}, {"wrong", "second"}, 0, 0});
  CHECK(TcpStoreClient::bytes(a.answer()) == "first");
  a.send({Op::kNumKeys, {}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(a.answer()) == 3);
  a.send({Op::kDeleteKey, {"cas"}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(a.answer()) == 1);
  a.send({Op::kDeleteKey, {"cas"}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(a.answer()) == 0);
  CHECK(a.get("never set") == "");  // what torch's libuv server answers too

  // The keys are the job's: ctrun's own clients read them under the worker-store prefix, and the
  // metrics count the requests.
  const ConnectionId ctrun_client = h.connect();
  h.send_raw(ctrun_client, std::string(kClientPreamble));
  h.hello(ctrun_client, "job");
  Json got = h.call(ctrun_client, {{"op", "get"}, {"key", "worker_store/init/"}});
  CHECK(got["value"] == to_binary("2"));
  const auto metrics = h.service->metrics();
  CHECK(metrics.requests.at("tcpstore_add") == 2);
  CHECK(metrics.requests.at("tcpstore_set") == 1);
  CHECK_FALSE(a.closed());
  CHECK_FALSE(b.closed());
}

TEST_CASE("worker store: torch 2.x's client (ping, multi ops, append, cancel, queues, barrier)") {
  ServiceHarness h(serving_worker_store());
  TcpStoreClient a(h, Dialect::kValidated);
  TcpStoreClient b(h, Dialect::kValidated);
  a.send({Op::kPing, {}, {}, 0, 0xdeadbeef});
  CHECK(a.answer() == std::string("\xef\xbe\xad\xde", 4));

  a.send({Op::kMultiSet, {"x", "y"}, {"1", "2"}, 0, 0});
  a.send({Op::kAppend, {"x"}, {"+3"}, 0, 0});
  a.send({Op::kAppend, {"z"}, {"new"}, 0, 0});
  a.send({Op::kMultiGet, {"x", "y", "z", "absent"}, {}, 0, 0});
  std::string expected;
  for (const char* v : {"1+3", "2", "new", ""}) append_bytes(expected, v);
  CHECK(a.answer() == expected);

  a.send({Op::kListKeys, {}, {}, 0, 0});
  std::string listed = a.answer();
  CHECK(TcpStoreClient::i64(listed.substr(0, 8)) == 3);
  CHECK(listed.find(std::string("\x01\0\0\0\0\0\0\0x", 9), 8) != std::string::npos);

  // A wait that times out on the client's side: cancelled, and no stop-waiting comes later.
  b.send({Op::kWait, {"late"}, {}, 0, 0});
  b.send({Op::kCancelWait, {}, {}, 0, 0});
  CHECK(b.answer() == u8(kWaitCanceled));
  a.set("late", "v");
  CHECK(b.answer().empty());

  // Queues: a blocked pop (wait, then pop) is woken by a push, one waiter per item.
  b.send({Op::kWait, {"q"}, {}, 0, 0});
  CHECK(b.answer().empty());
  a.send({Op::kQueuePush, {"q"}, {"item1"}, 0, 0});
  CHECK(b.answer() == u8(kStopWaiting));
  a.send({Op::kQueuePush, {"q"}, {"item2"}, 0, 0});
  a.send({Op::kQueueLen, {"q"}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(a.answer()) == 2);
  b.send({Op::kQueuePop, {"q"}, {}, 0, 0});
  std::string popped = b.answer();
  CHECK(TcpStoreClient::i64(popped.substr(0, 8)) == 2);
  CHECK(TcpStoreClient::bytes(popped.substr(8)) == "item1");
  b.send({Op::kQueuePop, {"q"}, {}, 0, 0});
  b.answer();
  b.send({Op::kQueuePop, {"q"}, {}, 0, 0});
  CHECK(b.answer() == std::string(8, '\0'));  // empty: the length and no value

  // A barrier of 3: the first two wait, the third releases everyone.
  TcpStoreClient c(h, Dialect::kValidated);
  a.send({Op::kBarrier, {"bar"}, {}, 3, 0});
  b.send({Op::kBarrier, {"bar"}, {}, 3, 0});
  CHECK(a.answer().empty());
  CHECK(b.answer().empty());
  c.send({Op::kBarrier, {"bar"}, {}, 3, 0});
  CHECK(a.answer() == u8(kStopWaiting));
  CHECK(b.answer() == u8(kStopWaiting));
  CHECK(c.answer() == u8(kStopWaiting));
}

TEST_CASE("worker store: torch 1.13's watch_key is told of creation, update and deletion") {
  ServiceHarness h(serving_worker_store());
  TcpStoreClient writer(h, Dialect::kLegacy);
  TcpStoreClient watcher(h, Dialect::kLegacy);
  watcher.send({Op::kWatchKey, {"w"}, {}, 0, 0});
  CHECK(watcher.answer() == u8(kCallbackRegistered));
  auto notice = [](std::uint8_t kind, const std::string& before, const std::string& after) {
    std::string n = u8(kind);
    append_bytes(n, "w");
    append_bytes(n, before);
    append_bytes(n, after);
    return n;
  };
  writer.set("w", "1");
  CHECK(watcher.answer() == notice(1, "", "1"));
  CHECK(writer.add("w", 2) == 3);
  CHECK(watcher.answer() == notice(0, "1", "3"));
  writer.send({Op::kDeleteKey, {"w"}, {}, 0, 0});
  writer.answer();
  CHECK(watcher.answer() == notice(2, "3", ""));
  writer.set("other", "x");
  CHECK(watcher.answer().empty());
}

TEST_CASE("worker store: each connection keeps its keys under the round it connected in") {
  ServiceHarness h(serving_worker_store());
  const ConnectionId agent = h.connect();
  h.send_raw(agent, std::string(kClientPreamble));
  h.hello(agent, "job");
  h.send(agent, with_id(join_request("n1", 1, 1), 1));
  Json formed = h.transport.take(agent);
  REQUIRE(formed["ok"] == true);
  const std::string prefix = formed["store_prefix"];

  TcpStoreClient worker(h, Dialect::kValidated);
  worker.set("/rank0", "here");
  Json got = h.call(agent, {{"op", "get"}, {"key", prefix + "/rank0"}, {"timeout_ms", 0}});
  CHECK(got["value"] == to_binary("here"));
  // A key of another round is not visible under this one.
  Json other =
      h.call(agent, {{"op", "set"}, {"key", "rdzv/0/99//rank0"}, {"value", to_binary("x")}});
  REQUIRE(other["ok"] == true);
  worker.send({Op::kCheck, {"/rank0"}, {}, 0, 0});
  CHECK(worker.answer() == u8(kCheckReady));
  worker.send({Op::kNumKeys, {}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(worker.answer()) == 1);
}

TEST_CASE("worker store: the journal records what TCPStore clients write") {
  MemoryStateLog log;
  ServiceOptions options = serving_worker_store();
  options.state = &log;
  ServiceHarness h(options);
  TcpStoreClient worker(h, Dialect::kLegacy);
  worker.set("k", "v");
  CHECK(worker.add("n", 5) == 5);
  REQUIRE(log.journal.size() == 2);
  CHECK(log.journal[0]["key"] == "worker_store/k");
  CHECK(log.journal[1]["value"] == to_binary("5"));
}

TEST_CASE("worker store: bad input closes that connection only, without an error frame") {
  ServiceHarness h(serving_worker_store());
  TcpStoreClient good(h, Dialect::kLegacy);
  good.set("n", "not a number");

  TcpStoreClient unknown(h, Dialect::kLegacy);
  h.send_raw(unknown.id(), std::string(1, '\x42'));
  CHECK(unknown.closed());
  CHECK(unknown.answer().empty());
  CHECK(mentions(h.logs, "unknown command 66"));

  TcpStoreClient adder(h, Dialect::kLegacy);
  adder.send({Op::kAdd, {"n"}, {}, 1, 0});
  CHECK(adder.closed());
  CHECK(mentions(h.logs, "not an integer"));

  TcpStoreClient huge(h, Dialect::kValidated);
  std::string set_huge(1, '\1');
  append_bytes(set_huge, "k");
  const std::uint64_t length = std::uint64_t{1} << 40;
  set_huge.append(reinterpret_cast<const char*>(&length), 8);
  h.send_raw(huge.id(), set_huge);
  CHECK(huge.closed());

  CHECK_FALSE(good.closed());
  CHECK(good.get("n") == "not a number");
  CHECK(h.service->num_connections() == 1);
}

TEST_CASE("worker store: silent connections wait, but ctrun's clients still owe a hello in time") {
  ServiceHarness h(serving_worker_store());
  const ConnectionId silent = h.connect();  // torch 1.13's second connection says nothing
  const ConnectionId ctrun_client = h.connect();
  h.send_raw(ctrun_client, std::string(kClientPreamble));
  TcpStoreClient worker(h, Dialect::kLegacy);
  worker.send({Op::kWait, {"never"}, {}, 0, 0});
  TcpStoreClient slow(h, Dialect::kLegacy);
  h.send_raw(slow.id(), std::string(3, '\0'));  // a SET cut short
  h.clock.advance(60s);
  h.service->tick();
  CHECK_FALSE(h.transport.closed.count(silent));
  CHECK(h.transport.closed.count(ctrun_client));  // no hello
  CHECK_FALSE(worker.closed());                   // a wait has no deadline on the server
  CHECK(slow.closed());                           // but a request must arrive whole in time
}

TEST_CASE(
    "worker store: with a port per job it opens at the agent's hello and closes with the job") {
  ServiceOptions options;
  options.worker_store_per_job = true;
  options.idle_job_timeout = 1s;
  ServiceHarness h(options);
  // A hello that does not ask (ctrun status, a worker's client) opens nothing.
  const ConnectionId status = h.connect();
  Json plain = h.hello(status, "a");
  CHECK(plain.count("worker_store") == 0);
  CHECK(h.transport.worker_store_ports.empty());

  const ConnectionId agent1 = h.connect();
  Json first = h.hello(agent1, "a", {{"worker_store", true}});
  CHECK(first["worker_store"] == true);
  CHECK(first["worker_store_port"] == 40000);
  const ConnectionId agent2 = h.connect();
  CHECK(h.hello(agent2, "a", {{"worker_store", true}})["worker_store_port"] == 40000);  // one
  const ConnectionId other = h.connect();
  CHECK(h.hello(other, "b", {{"worker_store", true}})["worker_store_port"] == 40001);
  // Not a boolean: not asked, and no harm done.
  const ConnectionId odd = h.connect();
  CHECK(h.hello(odd, "c", {{"worker_store", "yes"}}).count("worker_store") == 0);

  // Torch's clients on job a's port reach job a's store, seen by ctrun's clients too.
  const ConnectionId worker = h.connect_worker_store("a");
  h.send_raw(worker, encode_request(Dialect::kLegacy, {Op::kSet, {"k"}, {"from torch"}, 0, 0}));
  CHECK_FALSE(h.transport.closed.count(worker));
  Json got = h.call(agent1, {{"op", "get"}, {"key", "worker_store/k"}, {"timeout_ms", 0}});
  REQUIRE(got["ok"] == true);
  const auto& value = got["value"].get_binary();
  CHECK(std::string(value.begin(), value.end()) == "from torch");

  // Job b is dropped when its last connection has been gone a while: its port closes.
  h.service->on_disconnect(other);
  h.clock.advance(2s);
  h.service->tick();
  CHECK(h.transport.closed_worker_stores == std::set<std::string>{"b"});
  CHECK(h.transport.worker_store_ports.count("a") == 1);  // a's agents and worker are still on

  // No port to be had: the agent is not told of one (its workers host their own store).
  h.transport.refuse_worker_store = true;
  const ConnectionId late = h.connect();
  CHECK(h.hello(late, "d", {{"worker_store", true}}).count("worker_store") == 0);
}

TEST_CASE(
    "worker store: every rank of the job is served from one address, the limit follows the "
    "job's size, and torch's client over it is closed before any byte") {
  ServiceOptions options = serving_worker_store();
  options.max_connections_per_host = 2;  // ctrun's own protocol only
  options.worker_store_limits.minimum = 8;
  options.worker_store_limits.per_rank = 2;
  options.worker_store_limits.margin = 4;
  ServiceHarness h(options);
  // Before any round: the minimum, whatever the address.
  std::vector<std::unique_ptr<TcpStoreClient>> workers;
  for (int i = 0; i < 8; ++i) {
    workers.push_back(std::make_unique<TcpStoreClient>(h, Dialect::kValidated));
    CHECK(workers.back()->add("init/", 1) == i + 1);
  }
  auto refused = [&h] {
    TcpStoreClient late(h, Dialect::kValidated);
    late.send({Op::kPing, {}, {}, 0, 42});
    return late.closed() && late.answer().empty();  // closed, and not a byte said
  };
  CHECK(refused());
  CHECK(mentions(h.logs,
                 "10.0.0.9:1009 refused: job 'job' has 8 TCPStore connections open, its "
                 "worker store's limit (2 a rank for its 0 ranks and 4 more, at least 8)"));
  CHECK(mentions(h.logs, "worker_store_max_connections"));

  // A round of 10 ranks: 2 * 10 + 4 = 24 (its connections count its round's init/ afresh).
  const ConnectionId agent = h.connect("10.0.0.9");
  h.send_raw(agent, std::string(kClientPreamble));
  h.hello(agent, "job");
  h.send(agent, with_id(join_request("n1", 1, 1, 10), 1));
  REQUIRE(h.transport.take(agent)["ok"] == true);
  for (int i = 0; i < 16; ++i) {
    workers.push_back(std::make_unique<TcpStoreClient>(h, Dialect::kLegacy));
    CHECK(workers.back()->add("init/", 1) == i + 1);
  }
  CHECK(refused());
  // A closed connection frees its place.
  h.service->on_disconnect(workers.front()->id());
  TcpStoreClient again(h, Dialect::kValidated);
  CHECK(again.add("init/", 1) == 17);

  // ctrun's own clients from that address still meet their per-host limit, told in a frame.
  const ConnectionId second = h.connect("10.0.0.9");
  h.send_raw(second, std::string(kClientPreamble));
  CHECK(h.hello(second, "job")["ok"] == true);
  const ConnectionId third = h.connect("10.0.0.9");
  h.send_raw(third, std::string(kClientPreamble));
  CHECK(is_error(h.transport.take(third), "limit"));
  CHECK(h.transport.closed.count(third));
}

TEST_CASE("worker store: a fixed limit, and one job's port that ctrun's per-host limit ignores") {
  ServiceOptions options;
  options.worker_store_per_job = true;
  options.max_connections_per_host = 1;
  options.worker_store_limits.max_connections = 3;
  ServiceHarness h(options);
  const ConnectionId agent = h.connect("10.0.0.9");
  REQUIRE(h.hello(agent, "a", {{"worker_store", true}})["worker_store"] == true);
  std::vector<ConnectionId> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(h.connect_worker_store("a", "10.0.0.9"));
    h.send_raw(workers.back(), encode_request(Dialect::kLegacy, {Op::kAdd, {"init/"}, {}, 1, 0}));
    CHECK(TcpStoreClient::i64(h.transport.take_raw(workers.back())) == i + 1);
  }
  const ConnectionId late = h.connect_worker_store("a", "10.0.0.9");
  CHECK(h.transport.closed.count(late));
  CHECK(h.transport.take_raw(late).empty());
  CHECK(mentions(h.logs, "its worker store's limit (as set)"));
  CHECK(h.service->num_connections() == 4);  // the agent and three workers
}

TEST_CASE("worker store: refusals are logged once a second, with a count of the rest") {
  ServiceOptions options = serving_worker_store();
  options.worker_store_limits.max_connections = 1;
  ServiceHarness h(options);
  TcpStoreClient first(h, Dialect::kValidated);
  CHECK(first.add("init/", 1) == 1);
  for (int i = 0; i < 5; ++i) {
    TcpStoreClient late(h, Dialect::kValidated);
    late.send({Op::kPing, {}, {}, 0, 1});
    CHECK(late.closed());
  }
  std::size_t said = 0;
  for (const auto& line : h.logs) said += line.find("refused") != std::string::npos;
  CHECK(said == 1);
  h.clock.advance(2s);
  TcpStoreClient later(h, Dialect::kValidated);
  later.send({Op::kPing, {}, {}, 0, 1});
  CHECK(mentions(h.logs, "(and 4 more refused since the last said)"));
}

TEST_CASE("worker store: keys up to torch's 8 KiB, under a round's prefix too") {
  ServiceHarness h(serving_worker_store());
  const ConnectionId agent = h.connect();
  h.send_raw(agent, std::string(kClientPreamble));
  h.hello(agent, "job");
  h.send(agent, with_id(join_request("n1", 1, 1), 1));
  REQUIRE(h.transport.take(agent)["ok"] == true);
  TcpStoreClient worker(h, Dialect::kValidated);
  const std::string key(8192, 'k');
  worker.set(key, "v");
  CHECK(worker.get(key) == "v");
  CHECK_FALSE(worker.closed());
  worker.set(std::string(8193, 'k'), "v");  // over torch's limit: closed, as torch's server does
  CHECK(worker.closed());
}

TEST_CASE(
    "worker store: a round's keys go once no TCPStore connection is bound to it, so 1,000 "
    "restarts leave the store as big as one") {
  MemoryStateLog log;
  ServiceOptions options = serving_worker_store();
  options.state = &log;
  ServiceHarness h(options);
  const ConnectionId agent = h.connect();
  h.send_raw(agent, std::string(kClientPreamble));
  h.hello(agent, "job");
  auto keys_now = [&] { return h.call(agent, {{"op", "num_keys"}})["count"].get<std::size_t>(); };
  std::size_t after_first = 0;
  std::string first_prefix;
  for (int restart = 0; restart < 1000; ++restart) {
    // The member asks again: a new round (what a restart does).
    h.send(agent, with_id(join_request("n1", 1, 1, 4), restart));
    Json formed = h.transport.take(agent);
    REQUIRE(formed["ok"] == true);
    if (restart == 0) first_prefix = formed["store_prefix"];
    std::vector<std::unique_ptr<TcpStoreClient>> ranks;
    for (int r = 0; r < 4; ++r) {
      ranks.push_back(std::make_unique<TcpStoreClient>(h, Dialect::kValidated));
      ranks.back()->add("init/", 1);
      ranks.back()->set("/rank" + std::to_string(r), std::string(100, 'x'));
    }
    // The workers' round is still current: its keys stay while they run.
    if (restart == 0) after_first = keys_now();
    for (auto& w : ranks) h.service->on_disconnect(w->id());
    // Workers of the current round gone: their keys stay until a later round forms.
    REQUIRE(keys_now() == after_first);
  }
  CHECK(after_first >= 5);
  // The first round's keys are gone from the journal too.
  bool first_round_deleted = false;
  for (const auto& r : log.journal) {
    if (r.value("t", "") == "del" && r.value("key", "") == first_prefix + "init/") {
      first_round_deleted = true;
    }
  }
  CHECK(first_round_deleted);
}

TEST_CASE("worker store: torch 2.1's client (append, multi ops, delete at 7, cancel)") {
  ServiceHarness h(serving_worker_store());
  TcpStoreClient a(h, Dialect::kTorch21);
  CHECK(a.add("init/", 1) == 1);
  a.send({Op::kAppend, {"/log"}, {"ab"}, 0, 0});
  a.send({Op::kAppend, {"/log"}, {"cd"}, 0, 0});
  a.send({Op::kMultiSet, {"/x", "/y"}, {"1", "2"}, 0, 0});
  a.send({Op::kMultiGet, {"/log", "/x", "/y"}, {}, 0, 0});
  std::string expected;
  append_bytes(expected, "abcd");
  append_bytes(expected, "1");
  append_bytes(expected, "2");
  CHECK(a.answer() == expected);
  a.send({Op::kDeleteKey, {"/x"}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(a.answer()) == 1);
  a.send({Op::kWait, {"/never"}, {}, 0, 0});
  a.send({Op::kCancelWait, {}, {}, 0, 0});
  CHECK(a.answer() == u8(kWaitCanceled));
  CHECK_FALSE(a.closed());
  // Another rank's connection that opens with DELETE_KEY is read in the job's numbering.
  TcpStoreClient b(h, Dialect::kTorch21);
  b.send({Op::kDeleteKey, {"/y"}, {}, 0, 0});
  CHECK(TcpStoreClient::i64(b.answer()) == 1);
  CHECK_FALSE(b.closed());
}
