// One script of joins, newcomers, leaves, reports and store calls, run against both rendezvous
// backends (a ctrund Server in this process; etcd, both a real one and the memory etcd): the
// agent must not be able to tell them apart.
#include "ctrun/rendezvous/client.h"
#include "rendezvous/backend/backend.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include "catch.h"
#include "etcd_server.h"
#include "memory_etcd.h"
#include "process.h"
#include "rendezvous/daemon/server.h"
#include "rendezvous/etcd/etcd.h"
#include "rendezvous/etcd/etcd_client.h"
#include "run_task.h"

using namespace ctrun::rendezvous;
using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

// Makes a client of the service under test, for one job.
using MakeBackend =
    std::function<std::unique_ptr<Backend>(asio::io_context& io, const std::string& job)>;

// One node: its backend, the events it was sent, and its join's answer.
struct Node {
  std::string id;
  std::unique_ptr<Backend> backend;
  std::deque<BackendEvent> events;
  std::optional<Result<RoundAssignment>> joined;
};

class Script {
 public:
  Script(asio::io_context& io, const MakeBackend& make, std::string job)
      : io_(io), make_(make), job_(std::move(job)) {
    config_.min_nodes = 2;
    config_.max_nodes = 3;
    config_.last_call_timeout = 0s;
    config_.join_timeout = 30s;
  }

  Node& add(const std::string& id) {
    auto node = std::make_unique<Node>();
    node->id = id;
    node->backend = make_(io_, job_);
    Node* raw = node.get();
    node->backend->set_event_handler([raw](const BackendEvent& e) { raw->events.push_back(e); });
    REQUIRE(run_task(io_, node->backend->connect()).ok());
    node->backend->start_keep_alive(1s, 3);
    nodes_.push_back(std::move(node));
    return *raw;
  }

  // Starts a join; its answer lands in node.joined.
  void join(Node& node) {
    node.joined.reset();
    NodeInfo info{node.id, "127.0.0.1", node.id == "c" ? 1 : 2, 29500, -1};
    asio::co_spawn(
        io_,
        [&node, info, config = config_]() -> Task<void> {
          auto answer = co_await node.backend->join(info, config);
          node.joined = std::move(answer);
        },
        asio::detached);
  }

  // Runs the loop until `done` holds (bounded).
  bool until(const std::function<bool()>& done, std::chrono::milliseconds limit = 15s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(10ms);
    }
    return done();
  }

  // The next event of `node` of kind `kind` (earlier ones of other kinds are dropped).
  std::optional<BackendEvent> next_event(Node& node, BackendEvent::Kind kind) {
    std::optional<BackendEvent> found;
    until([&] {
      while (!node.events.empty() && !found) {
        BackendEvent e = node.events.front();
        node.events.pop_front();
        if (e.kind == kind) found = e;
      }
      return found.has_value();
    });
    return found;
  }

  asio::io_context& io() { return io_; }
  void set_nodes(int min_nodes, int max_nodes) {
    config_.min_nodes = min_nodes;
    config_.max_nodes = max_nodes;
  }

 private:
  asio::io_context& io_;
  const MakeBackend& make_;
  std::string job_;
  RendezvousConfig config_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

// `restarts`: the job's restart counter when the round formed, told to every member alike.
void expect_round(const std::vector<Node*>& members, int round, int restarts = 0) {
  int world = 0;
  std::set<int> ranks;
  for (Node* n : members) {
    INFO(n->id);
    REQUIRE(n->joined.has_value());
    REQUIRE(n->joined->ok());
    const RoundAssignment& a = n->joined->value();
    CHECK(a.round == round);
    CHECK(a.restart_count == restarts);
    CHECK(a.group_world_size == static_cast<int>(members.size()));
    ranks.insert(a.group_rank);
    world += n->id == "c" ? 1 : 2;
  }
  CHECK(ranks.size() == members.size());
  for (Node* n : members) {
    const RoundAssignment& a = n->joined->value();
    const RoundAssignment& first = members.front()->joined->value();
    CHECK(a.world_size == world);
    CHECK(a.master_addr == first.master_addr);
    CHECK(a.master_port == first.master_port);
    CHECK(a.store_prefix == first.store_prefix);
  }
}

// Nodes a and b join and form round 0.
void form_first_round(Script& s, Node& a, Node& b) {
  s.join(a);
  s.join(b);
  REQUIRE(s.until([&] { return a.joined && b.joined; }));
  expect_round({&a, &b}, 0);
}

// Many nodes join at once: one round 0 of them all (with etcd, one write takes many joins in,
// and none is taken in twice: a second one would reopen the round).
void run_crowd_script(asio::io_context& io, const MakeBackend& make) {
  constexpr int kNodes = 40;
  Script s(io, make, "crowd");
  s.set_nodes(kNodes, kNodes);
  std::vector<Node*> nodes;
  for (int i = 0; i < kNodes; ++i)
    nodes.push_back(&s.add(std::string("n").append(std::to_string(i))));  // g++ 12 -O3: -Wrestrict
  for (Node* n : nodes) s.join(*n);
  REQUIRE(s.until([&] {
    return std::all_of(nodes.begin(), nodes.end(), [](Node* n) { return n->joined.has_value(); });
  }));
  expect_round(nodes, 0);
}

void run_elastic_script(asio::io_context& io, const MakeBackend& make) {
  Script s(io, make, "conformance");
  Node& a = s.add("a");
  Node& b = s.add("b");
  form_first_round(s, a, b);

  // A newcomer reopens the round: the members are told and join again.
  Node& c = s.add("c");
  s.join(c);
  for (Node* n : {&a, &b}) {
    auto reopened = s.next_event(*n, BackendEvent::Kind::kRoundReopened);
    REQUIRE(reopened);
    CHECK(reopened->round == 1);
    s.join(*n);
  }
  REQUIRE(s.until([&] { return a.joined && b.joined && c.joined; }));
  expect_round({&a, &b, &c}, 1);
  CHECK(a.joined->value().store_prefix != "");

  // The store: add counts across nodes, get waits for a key set later.
  CHECK(run_task(io, a.backend->add("ctrun/restarts", 1)).value() == 1);
  CHECK(run_task(io, b.backend->add("ctrun/restarts", 2)).value() == 3);
  CHECK(run_task(io, c.backend->get("ctrun/restarts", 0ms)).value() == "3");
  CHECK_FALSE(run_task(io, c.backend->get("missing", 0ms)).ok());
  std::optional<Result<std::string>> late;
  asio::co_spawn(
      io,
      [&]() -> Task<void> {
        auto got = co_await b.backend->get("late", 10s);
        late = std::move(got);
      },
      asio::detached);
  REQUIRE(run_task(io, a.backend->set("late", "here")).ok());
  REQUIRE(s.until([&] { return late.has_value(); }));
  CHECK(late->value() == "here");

  // A member leaves: the others are told and form the next round without it.
  REQUIRE(run_task(io, c.backend->leave()).ok());
  for (Node* n : {&a, &b}) {
    auto reopened = s.next_event(*n, BackendEvent::Kind::kRoundReopened);
    REQUIRE(reopened);
    CHECK(reopened->round == 2);
    s.join(*n);
  }
  REQUIRE(s.until([&] { return a.joined && b.joined; }));
  expect_round({&a, &b}, 2, 3);
  // A restart counted after the round formed is not in it (it is the next attempt's).
  CHECK(run_task(io, a.backend->add("ctrun/restarts", 1)).value() == 4);
  CHECK(a.joined->value().restart_count == 3);
  auto resumed = run_task(io, a.backend->resume("a"));
  REQUIRE(resumed.ok());
  CHECK(resumed.value()["round"] == 2);
  CHECK(resumed.value()["state"] == "running");
  CHECK(run_task(io, a.backend->resume("c")).error().code == ErrorCode::kNotFound);

  // Both succeed: the job ends, and both are told.
  for (Node* n : {&a, &b}) {
    auto reported = run_task(io, n->backend->report(true, ""));
    INFO((reported.ok() ? std::string() : reported.error().message));
    REQUIRE(reported.ok());
  }
  for (Node* n : {&a, &b}) {
    auto ended = s.next_event(*n, BackendEvent::Kind::kJobEnded);
    REQUIRE(ended);
    CHECK(ended->state == "succeeded");
  }
  for (Node* n : {&a, &b, &c}) run_task(io, n->backend->release());
}

void run_failure_script(asio::io_context& io, const MakeBackend& make) {
  Script s(io, make, "conformance-fail");
  Node& a = s.add("a");
  Node& b = s.add("b");
  form_first_round(s, a, b);
  REQUIRE(run_task(io, a.backend->report(false, "rank 0 on h: exit code 3")).ok());
  auto ended = s.next_event(b, BackendEvent::Kind::kJobEnded);
  REQUIRE(ended);
  CHECK(ended->state == "failed");
  CHECK(ended->reason.find("exit code 3") != std::string::npos);
  // A node that comes while the ended job's nodes are still there is refused, not a new job.
  Node& c = s.add("c");
  s.join(c);
  REQUIRE(s.until([&] { return c.joined.has_value(); }));
  REQUIRE_FALSE(c.joined->ok());
  CHECK(c.joined->error().code == ErrorCode::kClosed);
  for (Node* n : {&a, &b, &c}) run_task(io, n->backend->release());
}

// Every join request was taken in or withdrawn (the refused late join's too): none is left for a
// later write to take in.
void expect_no_join_requests(asio::io_context& io, etcd::Kv& kv) {
  auto all = run_task(io, kv.range("/ctrun/", etcd::prefix_end("/ctrun/"), 0, true));
  REQUIRE(all.ok());
  std::vector<std::string> requests;
  for (const auto& found : all.value().kvs) {
    if (found.key.find("/joins/") != std::string::npos) requests.push_back(found.key);
  }
  CHECK(requests.empty());
  CHECK(all.value().kvs.size() > 3);  // the read saw the jobs' keys
}

}  // namespace

TEST_CASE("backend conformance: ctrund") {
  asio::io_context io;
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  auto server = Server::create(io, options);
  REQUIRE(server.ok());
  server.value()->start();
  const std::uint16_t port = server.value()->port();
  const MakeBackend make = [port](asio::io_context& on, const std::string& job) {
    ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.job = job;
    o.connect_timeout = 5s;
    return make_ctrund_backend(on, o);
  };
  run_elastic_script(io, make);
  run_failure_script(io, make);
  run_crowd_script(io, make);
}

TEST_CASE("backend conformance: etcd") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir dir("conformance");
  EtcdCluster etcd(dir, 1);
  asio::io_context io;
  const MakeBackend make = [&etcd](asio::io_context& on, const std::string& job) {
    BackendSpec o;
    o.service = BackendSpec::Service::kEtcd;
    o.endpoints = parse_endpoint_list(etcd.endpoints()).value();
    o.job = job;
    o.connect_timeout = 10s;
    o.lease_ttl = 3s;
    return make_etcd_backend(on, o);
  };
  run_elastic_script(io, make);
  run_failure_script(io, make);
  run_crowd_script(io, make);
  etcd::ClientOptions o;
  o.endpoints = parse_endpoint_list(etcd.endpoints()).value();
  etcd::Client raw(io, o);
  expect_no_join_requests(io, raw);
}

TEST_CASE("backend conformance: etcd in memory") {
  asio::io_context io;
  auto etcd = MemoryEtcd::create(io);
  const MakeBackend make = [&etcd](asio::io_context& on, const std::string& job) {
    BackendSpec o;
    o.service = BackendSpec::Service::kEtcd;
    o.endpoints = {Endpoint{"127.0.0.1", etcd::kDefaultPort}};  // this host's address: loopback
    o.job = job;
    o.connect_timeout = 10s;
    o.lease_ttl = 3s;
    o.connect_kv = [&etcd](const etcd::ClientOptions& c) { return etcd->connect(c); };
    return make_etcd_backend(on, o);
  };
  run_elastic_script(io, make);
  run_failure_script(io, make);
  run_crowd_script(io, make);
  auto raw = etcd->connect();
  expect_no_join_requests(io, *raw);
}
