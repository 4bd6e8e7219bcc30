// The etcd backend's decisions, one by one, with keys made by hand and a clock moved by hand: no
// etcd and no event loop. (The same backend against etcd: backend_conformance_test.cc.)
#include "rendezvous/backend/etcd_reducer.h"

#include "catch.h"

#include <algorithm>

using namespace ctrun::rendezvous;
using namespace std::chrono_literals;

namespace {

const std::string kJob = "train";
const std::string kPrefix = "/ctrun/train/";

etcd::KeyValue kv(const std::string& key, const std::string& value, std::int64_t mod) {
  etcd::KeyValue k;
  k.key = key;
  k.value = value;
  k.create_revision = mod;
  k.mod_revision = mod;
  k.version = 1;
  return k;
}

RendezvousConfig nodes(int min_nodes, int max_nodes) {
  RendezvousConfig c;
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.last_call_timeout = 0s;
  return c;
}

NodeInfo node(const std::string& id) { return NodeInfo{id, "10.0.0.1", 2, 29500, -1}; }

std::string request(const std::string& id, const RendezvousConfig& config) {
  return to_json(JoinRequest{node(id), config}).dump();
}

// A load read at `revision`: the state (if any), the live nodes' keys, the join requests.
etcd::TxnResult load(std::int64_t revision, const std::optional<etcd::KeyValue>& state,
                     const std::vector<std::string>& live,
                     const std::vector<etcd::KeyValue>& joins = {}) {
  etcd::TxnResult r;
  r.succeeded = true;
  r.revision = revision;
  r.ranges.resize(3);
  if (state) r.ranges[0].kvs.push_back(*state);
  for (const auto& id : live) r.ranges[1].kvs.push_back(kv(kPrefix + "nodes/" + id, "", 1));
  r.ranges[2].kvs = joins;
  return r;
}

bool has_op(const etcd::Txn& txn, etcd::Operation::Kind kind, const std::string& key) {
  return std::any_of(txn.success.begin(), txn.success.end(),
                     [&](const etcd::Operation& op) { return op.kind == kind && op.key == key; });
}

// The revision the transaction requires `key` to be unchanged since (0: absent).
std::optional<std::int64_t> compared_mod(const etcd::Txn& txn, const std::string& key) {
  for (const auto& c : txn.compare) {
    if (c.key == key && c.target != etcd::Compare::Target::kValue) return c.number;
  }
  return std::nullopt;
}

// One agent: its reducer, on a clock of the test's.
struct Agent {
  Agent(const std::string& id, const Clock& clock) : job(kJob, clock) { job.set_node(id); }
  EtcdReducer job;

  // Puts this agent's own join request at `revision`, as ask_to_join does.
  void ask(const RendezvousConfig& config, std::int64_t revision) {
    job.own_join_put(
        kv(kPrefix + "joins/" + job.node_id(), request(job.node_id(), config), revision));
  }
  // Plans `change` (reading the counter as `counter` when asked) and lands it at `revision`.
  EtcdReducer::Write land(const EtcdReducer::Change& change, std::int64_t revision,
                          EtcdReducer::RestartCounter counter = {}) {
    auto planned = job.plan(change);
    REQUIRE(planned.ok());
    if (planned.value().needs_restart_counter) planned = job.plan(change, counter);
    REQUIRE(planned.ok());
    REQUIRE(planned.value().write.has_value());
    EtcdReducer::Write write = *planned.value().write;
    job.written(write, revision);
    return write;
  }
};

// Another agent's write at `revision`, as this agent's watch brings it.
void see_state(EtcdReducer& job, const EtcdReducer::Write& write, std::int64_t revision) {
  etcd::WatchMessage m;
  m.revision = revision;
  m.events.push_back(etcd::WatchEvent{false, kv(kPrefix + "rendezvous", write.text, revision)});
  CHECK(job.take_watch(m));
}

}  // namespace

TEST_CASE(
    "etcd reducer: the first join creates the job and takes its request in, if neither moved") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a"})).ok());
  CHECK(a.job.loaded());
  a.ask(nodes(2, 3), 6);

  auto planned = a.job.plan(a.job.enter(node("a"), nodes(2, 3)));
  REQUIRE(planned.ok());
  REQUIRE(planned.value().write.has_value());
  const EtcdReducer::Write& w = *planned.value().write;
  CHECK(compared_mod(w.txn, kPrefix + "rendezvous") == 0);  // the key must not exist yet
  CHECK(compared_mod(w.txn, kPrefix + "joins/a") == 6);     // the very request read
  CHECK(has_op(w.txn, etcd::Operation::Kind::kPut, kPrefix + "rendezvous"));
  CHECK(has_op(w.txn, etcd::Operation::Kind::kDelete, kPrefix + "joins/a"));
  CHECK(w.applied == std::vector<std::string>{"a"});
  CHECK_FALSE(w.lines.empty());

  a.job.written(w, 7);
  auto step = a.job.join_step();
  REQUIRE(step.ok());
  CHECK(step.value().kind == EtcdReducer::JoinStep::Kind::kWait);  // one of two nodes
  // Landed, the request is forgotten: a second plan of the same change writes nothing.
  auto again = a.job.plan(a.job.enter(node("a"), nodes(2, 3)));
  REQUIRE(again.ok());
  CHECK_FALSE(again.value().write.has_value());
}

TEST_CASE(
    "etcd reducer: one write takes in at most 120 requests, its own and then the oldest first, "
    "and skips misfits") {
  ManualClock clock;
  Agent a("a", clock);
  std::vector<etcd::KeyValue> joins;
  for (int i = 0; i < 130; ++i) {
    const std::string id = std::string("n") + std::to_string(1000 + i);  // GCC bug 105651
    // The later the id, the older the request.
    joins.push_back(kv(kPrefix + "joins/" + id, request(id, nodes(1, 200)), 150 - i));
  }
  joins.push_back(kv(kPrefix + "joins/m", request("m", nodes(2, 2)), 200));  // other nnodes
  joins.push_back(kv(kPrefix + "joins/x", "not a request", 201));
  joins.push_back(kv(kPrefix + "joins/y", request("z", nodes(1, 200)), 202));  // not its id
  REQUIRE(a.job.take_load(load(300, std::nullopt, {"a"}, joins)).ok());
  a.ask(nodes(1, 200), 301);

  auto planned = a.job.plan(a.job.enter(node("a"), nodes(1, 200)));
  REQUIRE(planned.ok());
  const EtcdReducer::Write& w = *planned.value().write;
  REQUIRE(w.applied.size() == kJoinsPerWrite);
  CHECK(w.applied.front() == "a");
  CHECK(w.applied[1] == "n1129");  // the oldest
  CHECK(w.applied.back() == "n1011");
  CHECK(std::find(w.applied.begin(), w.applied.end(), "n1010") == w.applied.end());  // newer
  for (const char* left_out : {"m", "x", "y", "z"}) {
    CHECK(std::find(w.applied.begin(), w.applied.end(), left_out) == w.applied.end());
  }
  CHECK(w.txn.compare.size() == 1 + kJoinsPerWrite);
  CHECK(w.txn.success.size() == 1 + kJoinsPerWrite);
}

TEST_CASE(
    "etcd reducer: a node whose request another's write took in writes no one else's request") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a", "b", "c", "d"})).ok());
  a.ask(nodes(5, 5), 6);
  const auto created = a.land(a.job.enter(node("a"), nodes(5, 5)), 7);
  const etcd::KeyValue state = kv(kPrefix + "rendezvous", created.text, 7);
  const etcd::KeyValue join_b = kv(kPrefix + "joins/b", request("b", nodes(5, 5)), 8);
  const etcd::KeyValue join_c = kv(kPrefix + "joins/c", request("c", nodes(5, 5)), 9);
  const etcd::KeyValue join_d = kv(kPrefix + "joins/d", request("d", nodes(5, 5)), 10);

  // b's request pending: its write takes in b and whatever else waits.
  Agent b("b", clock);
  REQUIRE(b.job.take_load(load(10, state, {"a", "b", "c", "d"}, {join_b, join_c, join_d})).ok());
  b.ask(nodes(5, 5), 8);
  const auto enter_b = b.job.enter(node("b"), nodes(5, 5));
  auto first = b.job.plan(enter_b);
  REQUIRE(first.ok());
  REQUIRE(first.value().write.has_value());
  CHECK(first.value().write->applied == std::vector<std::string>{"b", "c", "d"});

  // d's write, which saw b's request but not c's, landed first and took b in.
  Agent d("d", clock);
  REQUIRE(d.job.take_load(load(10, state, {"a", "b", "c", "d"}, {join_b, join_d})).ok());
  d.ask(nodes(5, 5), 10);
  const auto took_b = d.land(d.job.enter(node("d"), nodes(5, 5)), 11);
  REQUIRE(took_b.applied == std::vector<std::string>{"d", "b"});

  // b re-reads: its own request is in, c's still waits. b writes nothing; c's agent takes c in.
  etcd::TxnResult reread;
  reread.succeeded = true;
  reread.revision = 11;
  reread.ranges.resize(2);
  reread.ranges[0].kvs.push_back(kv(kPrefix + "rendezvous", took_b.text, 11));
  reread.ranges[1].kvs.push_back(join_c);
  REQUIRE(b.job.take_reload(reread).ok());
  auto retry = b.job.plan(enter_b);
  REQUIRE(retry.ok());
  CHECK_FALSE(retry.value().write.has_value());
  auto step = b.job.join_step();
  REQUIRE(step.ok());
  CHECK(step.value().kind == EtcdReducer::JoinStep::Kind::kWait);
}

TEST_CASE(
    "etcd reducer: the agents of the three oldest waiting requests write them in, the others wait "
    "for those writes") {
  ManualClock clock;
  const RendezvousConfig config = nodes(8, 8);
  const auto later = EtcdReducer::JoinTurn::kAfterOlder;
  const std::vector<std::string> ids{"a", "b", "c", "d", "e", "f", "g", "h"};
  std::vector<etcd::KeyValue> joins;  // a's the oldest, at revision 2
  for (std::size_t i = 0; i < ids.size(); ++i) {
    joins.push_back(kv(kPrefix + "joins/" + ids[i], request(ids[i], config), 2 + i));
  }

  // No job yet: the three oldest requests' agents start it; d's agent waits, unless told now.
  Agent d("d", clock);
  REQUIRE(d.job.take_load(load(10, std::nullopt, ids, joins)).ok());
  d.ask(config, 5);
  CHECK_FALSE(d.job.writes_joins());
  auto waits = d.job.plan(d.job.enter(node("d"), config, later));
  REQUIRE(waits.ok());
  CHECK_FALSE(waits.value().write.has_value());
  auto now = d.job.plan(d.job.enter(node("d"), config));
  REQUIRE(now.ok());
  CHECK(now.value().write.has_value());

  // c, the third oldest, starts it; its read had seen a, b and c only.
  Agent c("c", clock);
  REQUIRE(c.job.take_load(load(4, std::nullopt, ids, {joins[0], joins[1], joins[2]})).ok());
  c.ask(config, 4);
  CHECK(c.job.writes_joins());
  const auto started = c.land(c.job.enter(node("c"), config, later), 11);
  CHECK(started.applied == std::vector<std::string>{"c", "a", "b"});

  // d, e and f wait the longest now: f writes; h, behind d, e, f and g, waits.
  Agent f("f", clock);
  Agent h("h", clock);
  REQUIRE(f.job.take_load(load(10, std::nullopt, ids, joins)).ok());
  REQUIRE(h.job.take_load(load(10, std::nullopt, ids, joins)).ok());
  f.ask(config, 7);
  h.ask(config, 9);
  see_state(f.job, started, 11);
  see_state(h.job, started, 11);
  CHECK(f.job.writes_joins());
  CHECK_FALSE(h.job.writes_joins());
  auto h_step = h.job.join_step();
  REQUIRE(h_step.ok());
  CHECK(h_step.value().kind == EtcdReducer::JoinStep::Kind::kTakeIn);
  auto h_waits = h.job.plan(h.job.enter(node("h"), config, later));
  REQUIRE(h_waits.ok());
  CHECK_FALSE(h_waits.value().write.has_value());
  // f's write leaves out what c's took in (its keys are gone: a compare on them would fail).
  const auto rest = f.land(f.job.enter(node("f"), config, later), 12);
  CHECK(rest.applied == std::vector<std::string>{"f", "d", "e", "g", "h"});

  // h's request is in: it writes nothing, and the round of eight has formed.
  see_state(h.job, rest, 12);
  CHECK_FALSE(h.job.writes_joins());
  auto joined = h.job.join_step();
  REQUIRE(joined.ok());
  CHECK(joined.value().kind == EtcdReducer::JoinStep::Kind::kJoined);
}

TEST_CASE("etcd reducer: the write that forms a round reads the restart counter and compares it") {
  ManualClock clock;
  Agent a("a", clock);
  Agent b("b", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a", "b"})).ok());
  a.ask(nodes(2, 2), 6);
  const auto created = a.land(a.job.enter(node("a"), nodes(2, 2)), 7);

  REQUIRE(b.job.take_load(load(7, kv(kPrefix + "rendezvous", created.text, 7), {"a", "b"})).ok());
  b.ask(nodes(2, 2), 8);
  const auto enter = b.job.enter(node("b"), nodes(2, 2));
  auto first = b.job.plan(enter);
  REQUIRE(first.ok());
  CHECK(first.value().needs_restart_counter);
  CHECK_FALSE(first.value().write.has_value());
  auto second = b.job.plan(enter, EtcdReducer::RestartCounter{5, 17});
  REQUIRE(second.ok());
  REQUIRE(second.value().write.has_value());
  const EtcdReducer::Write w = *second.value().write;
  CHECK(compared_mod(w.txn, kPrefix + "store/ctrun/restarts") == 17);
  CHECK(compared_mod(w.txn, kPrefix + "rendezvous") == 7);
  b.job.written(w, 9);
  see_state(a.job, w, 9);

  for (Agent* agent : {&a, &b}) {
    auto step = agent->job.join_step();
    REQUIRE(step.ok());
    REQUIRE(step.value().kind == EtcdReducer::JoinStep::Kind::kJoined);
    CHECK(step.value().assignment.round == 0);
    CHECK(step.value().assignment.restart_count == 5);
    CHECK(step.value().assignment.group_world_size == 2);
  }
}

TEST_CASE("etcd reducer: an ended job whose nodes are gone gives way to a new one and its store") {
  ManualClock clock;
  Agent a("a", clock);
  Agent b("b", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a", "b"})).ok());
  a.ask(nodes(1, 2), 6);
  a.land(a.job.enter(node("a"), nodes(1, 2)), 7);
  REQUIRE(a.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kJoined);
  const auto ended = a.land(a.job.report(false, "rank 0 exited with 1"), 8);

  // While a node of the ended job is alive, the newcomer is refused with the reason.
  REQUIRE(b.job.take_load(load(8, kv(kPrefix + "rendezvous", ended.text, 8), {"a", "b"})).ok());
  b.ask(nodes(1, 2), 9);
  auto refused = b.job.plan(b.job.enter(node("b"), nodes(1, 2)));
  REQUIRE(refused.ok());
  CHECK_FALSE(refused.value().write.has_value());
  auto step = b.job.join_step();
  REQUIRE_FALSE(step.ok());
  CHECK(step.error().code == ErrorCode::kClosed);
  CHECK(step.error().message.find("rank 0 exited with 1") != std::string::npos);

  // Once they are gone, the same id starts a new job: generation 1, the old store deleted.
  const auto own_request = kv(kPrefix + "joins/b", request("b", nodes(1, 2)), 9);
  REQUIRE(b.job.take_load(load(10, kv(kPrefix + "rendezvous", ended.text, 8), {"b"}, {own_request}))
              .ok());
  auto fresh = b.job.plan(b.job.enter(node("b"), nodes(1, 2)));
  REQUIRE(fresh.ok());
  REQUIRE(fresh.value().write.has_value());
  const EtcdReducer::Write& w = *fresh.value().write;
  CHECK(has_op(w.txn, etcd::Operation::Kind::kDelete, kPrefix + "store/"));
  CHECK(has_op(w.txn, etcd::Operation::Kind::kDelete, kPrefix + "ops/"));
  CHECK(has_op(w.txn, etcd::Operation::Kind::kDelete, kPrefix + "quorum/"));
  b.job.written(w, 11);
  auto joined = b.job.join_step();
  INFO((joined.ok() ? std::string() : joined.error().message));
  REQUIRE(joined.ok());
  REQUIRE(joined.value().kind == EtcdReducer::JoinStep::Kind::kJoined);
  CHECK(joined.value().assignment.store_prefix == round_store_prefix(1, 0));
  CHECK(joined.value().assignment.restart_count == 0);  // a new job's store is empty
}

TEST_CASE(
    "etcd reducer: an older read changes nothing, and a request put after a read survives it") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a"})).ok());
  a.ask(nodes(1, 3), 6);
  const auto w = a.land(a.job.enter(node("a"), nodes(1, 3)), 7);
  REQUIRE(a.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kJoined);

  // A read answered before the write (revision 6) must not take the job away again.
  etcd::TxnResult stale;
  stale.revision = 6;
  stale.ranges.resize(2);
  stale.ranges[1].kvs.push_back(kv(kPrefix + "joins/a", request("a", nodes(1, 3)), 6));
  REQUIRE(a.job.take_reload(stale).ok());
  auto view = a.job.view();
  REQUIRE(view.ok());
  REQUIRE(view.value() != nullptr);
  CHECK(view.value()->has_node("a"));
  CHECK(a.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kJoined);

  // This node asks again (revision 9); a read answered at revision 8 does not lose the request.
  a.ask(nodes(1, 3), 9);
  etcd::TxnResult before;
  before.revision = 8;
  before.ranges.resize(2);
  before.ranges[0].kvs.push_back(kv(kPrefix + "rendezvous", w.text, 7));
  REQUIRE(a.job.take_reload(before).ok());
  CHECK(a.job.own_join_dropped());
  CHECK_FALSE(a.job.own_join_dropped());

  // A reply with a wrong number of ranges is an error, not a crash.
  etcd::TxnResult short_read;
  short_read.revision = 10;
  CHECK_FALSE(a.job.take_reload(short_read).ok());
  CHECK_FALSE(a.job.take_load(short_read).ok());
}

TEST_CASE(
    "etcd reducer: a peer's key gone makes it removable, the round reopens and is told once") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a", "b"})).ok());
  a.ask(nodes(2, 3), 6);
  // The reload that follows a's request sees b's too.
  etcd::TxnResult joins;
  joins.revision = 7;
  joins.ranges.resize(2);
  joins.ranges[1].kvs.push_back(kv(kPrefix + "joins/a", request("a", nodes(2, 3)), 6));
  joins.ranges[1].kvs.push_back(kv(kPrefix + "joins/b", request("b", nodes(2, 3)), 7));
  REQUIRE(a.job.take_reload(joins).ok());
  a.land(a.job.enter(node("a"), nodes(2, 3)), 8);
  auto step = a.job.join_step();
  INFO((step.ok() ? std::string() : step.error().message));
  REQUIRE(step.value().kind == EtcdReducer::JoinStep::Kind::kJoined);
  CHECK(a.job.removable_dead().empty());
  CHECK_FALSE(a.job.notice().event.has_value());

  etcd::WatchMessage gone;
  gone.revision = 9;
  etcd::KeyValue key = kv(kPrefix + "nodes/b", "", 9);
  gone.events.push_back(etcd::WatchEvent{true, key});
  CHECK(a.job.take_watch(gone));
  CHECK(a.job.removable_dead() == std::vector<std::string>{"b"});
  a.land(a.job.remove({"b"}, "its etcd lease expired"), 10);
  CHECK(a.job.removable_dead().empty());

  auto told = a.job.notice();
  REQUIRE(told.event.has_value());
  CHECK(told.event->kind == BackendEvent::Kind::kRoundReopened);
  CHECK(told.event->round == 1);
  CHECK(told.event->reason.find("b") != std::string::npos);
  CHECK_FALSE(a.job.notice().event.has_value());  // once

  // A store key (ops/ markers too) changes nothing this agent acts on.
  etcd::WatchMessage marker;
  marker.events.push_back(etcd::WatchEvent{false, kv(kPrefix + "ops/1234", "1", 11)});
  CHECK_FALSE(a.job.take_watch(marker));
}

TEST_CASE(
    "etcd reducer: a peer seen gone is read again before its removal: a key back on a new lease "
    "keeps it, a deletion newer than that read wins") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a", "b", "c"})).ok());
  a.ask(nodes(3, 3), 6);
  etcd::TxnResult joins;
  joins.revision = 8;
  joins.ranges.resize(2);
  for (const auto& [id, rev] : {std::pair<std::string, int>{"a", 6}, {"b", 7}, {"c", 8}}) {
    joins.ranges[1].kvs.push_back(kv(kPrefix + "joins/" + id, request(id, nodes(3, 3)), rev));
  }
  REQUIRE(a.job.take_reload(joins).ok());
  a.land(a.job.enter(node("a"), nodes(3, 3)), 9);
  REQUIRE(a.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kJoined);

  // b and c lose their leases; b joins again on a new lease, a put no watch brings.
  etcd::WatchMessage gone;
  gone.revision = 10;
  gone.events.push_back(etcd::WatchEvent{true, kv(kPrefix + "nodes/b", "", 10)});
  gone.events.push_back(etcd::WatchEvent{true, kv(kPrefix + "nodes/c", "", 10)});
  CHECK(a.job.take_watch(gone));
  const auto candidates = a.job.removable_dead();
  REQUIRE(candidates == std::vector<std::string>{"b", "c"});
  const etcd::Txn read = a.job.node_keys_request(candidates);
  REQUIRE(read.success.size() == 2);
  CHECK(has_op(read, etcd::Operation::Kind::kRange, kPrefix + "nodes/b"));

  // The read at 12 finds b's key (put again at 11) and not c's.
  etcd::TxnResult found;
  found.revision = 12;
  found.ranges.resize(2);
  found.ranges[0].kvs.push_back(kv(kPrefix + "nodes/b", "10.0.0.2", 11));
  REQUIRE(a.job.take_node_keys(candidates, found).ok());
  CHECK(a.job.removable_dead() == std::vector<std::string>{"c"});

  // b goes again at 13, but a read answered at 12 (sent before) still finds its key: the
  // deletion is newer, b stays removable.
  etcd::WatchMessage again;
  again.revision = 13;
  again.events.push_back(etcd::WatchEvent{true, kv(kPrefix + "nodes/b", "", 13)});
  CHECK(a.job.take_watch(again));
  REQUIRE(a.job
              .take_node_keys({"b"},
                              [&] {
                                etcd::TxnResult late;
                                late.revision = 12;
                                late.ranges.resize(1);
                                late.ranges[0].kvs.push_back(
                                    kv(kPrefix + "nodes/b", "10.0.0.2", 11));
                                return late;
                              }())
              .ok());
  CHECK(a.job.removable_dead() == std::vector<std::string>{"b", "c"});

  // An answer of the wrong shape is an error, not a guess.
  etcd::TxnResult short_read;
  short_read.revision = 14;
  CHECK_FALSE(a.job.take_node_keys({"b", "c"}, short_read).ok());
  // At most kNodeKeysPerRead keys in one transaction.
  std::vector<std::string> many(kNodeKeysPerRead + 5, "x");
  CHECK(a.job.node_keys_request(many).success.size() == kNodeKeysPerRead);
}

TEST_CASE(
    "etcd reducer: the agents of the first three live members write a removal at once, the "
    "others wait") {
  ManualClock clock;
  const std::vector<std::string> ids{"a", "b", "c", "d", "e"};
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, ids)).ok());
  a.ask(nodes(5, 5), 6);
  etcd::TxnResult joins;
  joins.revision = 10;
  joins.ranges.resize(2);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    joins.ranges[1].kvs.push_back(kv(kPrefix + "joins/" + ids[i], request(ids[i], nodes(5, 5)),
                                     static_cast<std::int64_t>(6 + i)));
  }
  REQUIRE(a.job.take_reload(joins).ok());
  const EtcdReducer::Write formed = a.land(a.job.enter(node("a"), nodes(5, 5)), 11);

  // Every agent's view of the formed round, all five alive.
  std::vector<std::unique_ptr<Agent>> agents;
  for (const auto& id : ids) {
    agents.push_back(std::make_unique<Agent>(id, clock));
    REQUIRE(agents.back()
                ->job.take_load(load(11, kv(kPrefix + "rendezvous", formed.text, 11), ids))
                .ok());
  }
  auto writers = [&] {
    std::vector<std::string> out;
    for (auto& agent : agents) {
      if (agent->job.writes_removals()) out.push_back(agent->job.node_id());
    }
    return out;
  };
  CHECK(writers() == std::vector<std::string>{"a", "b", "c"});

  // a and b lose their leases: c, d and e are the first live members now.
  etcd::WatchMessage gone;
  gone.revision = 12;
  gone.events.push_back(etcd::WatchEvent{true, kv(kPrefix + "nodes/a", "", 12)});
  gone.events.push_back(etcd::WatchEvent{true, kv(kPrefix + "nodes/b", "", 12)});
  for (auto& agent : agents) agent->job.take_watch(gone);
  CHECK(agents[2]->job.removable_dead() == std::vector<std::string>{"a", "b"});
  CHECK(writers() == std::vector<std::string>{"c", "d", "e"});

  // An agent whose node is not in the state (a join waiting to be taken in) never writes first.
  Agent late("f", clock);
  REQUIRE(late.job.take_load(load(12, kv(kPrefix + "rendezvous", formed.text, 11), {"c"})).ok());
  CHECK_FALSE(late.job.writes_removals());
}

TEST_CASE(
    "etcd reducer: a waiting join reads its turn as the keys of the few older requests, and "
    "writes when fewer than three wait ahead") {
  ManualClock clock;
  Agent d("d", clock);
  REQUIRE(d.job.take_load(load(5, std::nullopt, {"a", "b", "c", "d"})).ok());
  d.ask(nodes(1, 8), 20);
  const etcd::Txn turn = d.job.turn_request();
  REQUIRE(turn.success.size() == 1);
  CHECK(turn.success[0].keys_only);
  CHECK(turn.success[0].max_mod_revision == 19);  // older than its own request
  CHECK(turn.success[0].limit == static_cast<std::int64_t>(kJoinWriters));

  auto answer = [&](std::int64_t revision, const std::vector<std::string>& older) {
    etcd::TxnResult r;
    r.revision = revision;
    r.ranges.resize(1);
    for (const auto& id : older) r.ranges[0].kvs.push_back(kv(kPrefix + "joins/" + id, "", 10));
    return r;
  };
  REQUIRE(d.job.take_turn(answer(21, {"a", "b", "c"})).ok());
  CHECK_FALSE(d.job.writes_joins());  // three ahead: their agents write
  REQUIRE(d.job.take_turn(answer(22, {"b", "c"})).ok());
  CHECK(d.job.writes_joins());
  // A full read of the requests, newer than the turn, decides again (and sees three ahead).
  etcd::TxnResult all;
  all.revision = 23;
  all.ranges.resize(2);
  for (const auto& [id, rev] :
       {std::pair<std::string, int>{"a", 10}, {"b", 11}, {"c", 12}, {"d", 20}}) {
    all.ranges[1].kvs.push_back(kv(kPrefix + "joins/" + id, request(id, nodes(1, 8)), rev));
  }
  REQUIRE(d.job.take_reload(all).ok());
  CHECK_FALSE(d.job.writes_joins());
  CHECK_FALSE(d.job.take_turn(etcd::TxnResult{}).ok());  // not the one range it asked for
}

TEST_CASE("etcd reducer: the job's end is told once, removal by another node is a lost place") {
  ManualClock clock;
  Agent a("a", clock);
  Agent b("b", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a", "b"})).ok());
  a.ask(nodes(2, 2), 6);
  const auto created = a.land(a.job.enter(node("a"), nodes(2, 2)), 7);
  REQUIRE(b.job.take_load(load(7, kv(kPrefix + "rendezvous", created.text, 7), {"a", "b"})).ok());
  b.ask(nodes(2, 2), 8);
  const auto formed = b.land(b.job.enter(node("b"), nodes(2, 2)), 9);
  see_state(a.job, formed, 9);
  REQUIRE(a.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kJoined);
  REQUIRE(b.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kJoined);

  // b removes a (its lease gone, as b saw it): a hears the round reopen, then that it lost its
  // place in the job.
  const auto removed = b.land(b.job.remove({"a"}, "its etcd lease expired"), 10);
  see_state(a.job, removed, 10);
  auto reopened = a.job.notice();
  REQUIRE(reopened.event.has_value());
  CHECK(reopened.event->kind == BackendEvent::Kind::kRoundReopened);
  auto lost = a.job.notice();
  CHECK_FALSE(lost.event.has_value());
  REQUIRE(lost.lost.has_value());
  CHECK(lost.lost->find("its etcd lease expired") != std::string::npos);
  // Told once: after a's reconnect the state (a not in it) is read again while a joins again,
  // and that is no second loss (it would stop the renewals of the lease a joins on).
  CHECK_FALSE(a.job.notice().lost.has_value());

  // b fails: its job ends, told once.
  const auto failed = b.land(b.job.report(false, "exit code 3"), 11);
  auto ended = b.job.notice();
  REQUIRE(ended.event.has_value());
  CHECK(ended.event->kind == BackendEvent::Kind::kJobEnded);
  CHECK(ended.event->state == "failed");
  CHECK(ended.event->reason.find("exit code 3") != std::string::npos);
  CHECK_FALSE(b.job.notice().event.has_value());

  // A node that runs in no round (left, or still joining) hears nothing.
  b.job.stop_running();
  see_state(b.job, failed, 11);
  CHECK_FALSE(b.job.notice().event.has_value());
}

TEST_CASE("etcd reducer: a write that landed although its answer was lost is known as its own") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a"})).ok());
  a.ask(nodes(1, 2), 6);
  auto planned = a.job.plan(a.job.enter(node("a"), nodes(1, 2)));
  REQUIRE(planned.ok());
  const EtcdReducer::Write w = *planned.value().write;
  CHECK_FALSE(a.job.holds(w));
  see_state(a.job, w, 7);  // the re-read finds it there
  CHECK(a.job.holds(w));
  clock.advance(1s);  // another write of the same change is another state (its save time)
  auto other = a.job.plan(a.job.report(true, ""));
  REQUIRE(other.ok());
  REQUIRE(other.value().write.has_value());
  CHECK_FALSE(a.job.holds(*other.value().write));
  // A failure text that is not UTF-8 is replaced in the value: the write is still known.
  auto odd = a.job.plan(a.job.report(false, "worker said \xff\xfe"));
  REQUIRE(odd.ok());
  REQUIRE(odd.value().write.has_value());
  see_state(a.job, *odd.value().write, 8);
  CHECK(a.job.holds(*odd.value().write));
}

TEST_CASE(
    "etcd reducer: a deadline is due when the clock says so, and only then does a tick write") {
  ManualClock clock;
  Agent a("a", clock);
  RendezvousConfig config = nodes(1, 3);
  config.last_call_timeout = 5s;  // one node of at most three: the round waits for the last call
  REQUIRE(a.job.take_load(load(5, std::nullopt, {"a"})).ok());
  a.ask(config, 6);
  a.land(a.job.enter(node("a"), config), 7);
  REQUIRE(a.job.join_step().value().kind == EtcdReducer::JoinStep::Kind::kWait);
  auto due = a.job.next_deadline();
  REQUIRE(due.has_value());
  CHECK(*due - clock.now() <= 5s);
  CHECK(*due - clock.now() > 4s);

  auto early = a.job.plan(a.job.tick());
  REQUIRE(early.ok());
  CHECK_FALSE(early.value().write.has_value());
  CHECK_FALSE(early.value().needs_restart_counter);

  clock.advance(6s);
  a.land(a.job.tick(), 8, EtcdReducer::RestartCounter{2, 4});
  auto step = a.job.join_step();
  REQUIRE(step.ok());
  REQUIRE(step.value().kind == EtcdReducer::JoinStep::Kind::kJoined);
  CHECK(step.value().assignment.group_world_size == 1);
  CHECK(step.value().assignment.restart_count == 2);
}

TEST_CASE("etcd reducer: a state key that is not a rendezvous is a clear error") {
  ManualClock clock;
  Agent a("a", clock);
  REQUIRE(a.job.take_load(load(5, kv(kPrefix + "rendezvous", "{not json", 3), {"a"})).ok());
  auto view = a.job.view();
  REQUIRE_FALSE(view.ok());
  CHECK(view.error().message ==
        "etcd key " + kPrefix + "rendezvous does not hold a ctrun rendezvous (not its JSON)");
  auto planned = a.job.plan(a.job.enter(node("a"), nodes(1, 2)));
  CHECK_FALSE(planned.ok());
}
