// --state_dir in memory: the record codec, a rendezvous saved and restored, and a Service that
// "restarts" from what another one recorded.
#include "rendezvous/core/state_log.h"

#include "catch.h"

#include "memory_state_log.h"
#include "service_harness.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;
using namespace std::chrono_literals;

namespace {

ServiceOptions recorded_by(MemoryStateLog& log) {
  ServiceOptions options;
  options.state = &log;
  return options;
}

}  // namespace

TEST_CASE("state: records round-trip, and a torn or damaged tail is cut off") {
  const Json a{{"t", "set"}, {"job", "j"}, {"key", "k"}, {"value", to_binary("v")}};
  const Json b{{"t", "del"}, {"job", "j"}, {"key", "k"}};
  const std::string bytes = encode_state_record(a) + encode_state_record(b);
  auto whole = decode_state_records(bytes);
  CHECK(whole.damage.empty());
  CHECK(whole.good_bytes == bytes.size());
  REQUIRE(whole.records.size() == 2);
  CHECK(whole.records[0] == a);
  CHECK(whole.records[1] == b);

  for (std::size_t cut = 1; cut < encode_state_record(b).size(); ++cut) {
    auto torn = decode_state_records(std::string_view(bytes).substr(0, bytes.size() - cut));
    INFO(cut);
    CHECK(torn.records.size() == 1);
    CHECK(torn.good_bytes == encode_state_record(a).size());
    CHECK_FALSE(torn.damage.empty());
  }
  std::string flipped = bytes;
  flipped.back() ^= 0x01;
  auto damaged = decode_state_records(flipped);
  CHECK(damaged.records.size() == 1);
  CHECK(damaged.damage.find("checksum") != std::string::npos);
}

TEST_CASE("state: a rendezvous restored from save() goes on as the original would") {
  ManualClock clock;
  RendezvousConfig config;
  config.min_nodes = 2;
  config.max_nodes = 3;
  config.last_call_timeout = 0s;
  Rendezvous original("job", config, clock, {}, 4);
  auto node = [](const std::string& id, int workers) {
    return NodeInfo{id, id + ".host", workers, 29500, -1};
  };
  REQUIRE(original.join(node("a", 2)));
  REQUIRE(original.join(node("b", 3)));
  REQUIRE(original.formed());
  CHECK(original.round_restart_count_unset());
  CHECK(original.assignment("a")->restart_count == -1);
  original.set_round_restart_count(2);  // the etcd backend, in the write that formed the round
  CHECK_FALSE(original.round_restart_count_unset());
  CHECK(original.assignment("b")->restart_count == 2);
  REQUIRE(original.report("a", true, ""));
  const auto before = original.revision();
  original.keep_alive("b");
  CHECK(original.revision() == before);  // keep-alives are not state worth recording

  clock.advance(1h);  // the restored timers start from the restore, not from the save
  auto restored = Rendezvous::restore(original.save(), clock);
  REQUIRE(restored);
  Rendezvous& r = *restored.value();
  CHECK(r.save() == original.save());
  CHECK(r.generation() == 4);
  CHECK(r.round() == 0);
  CHECK(r.formed());
  CHECK(r.assignment("a")->restart_count == 2);
  CHECK(r.tick().empty());  // nobody is late: every node got a fresh keep-alive window

  // b fails: the job ends, and a, which had succeeded, is told.
  auto ended = r.report("b", false, "boom");
  REQUIRE(ended);
  CHECK(r.state() == JobState::kFailed);
  REQUIRE(ended.value().size() == 2);

  auto bad = Rendezvous::restore(Json{{"job", "x"}}, clock);
  CHECK_FALSE(bad);
}

TEST_CASE("state: restored with carried timers, the last call and join deadlines go on") {
  ManualClock clock;
  RendezvousConfig config;
  config.min_nodes = 2;
  config.max_nodes = 3;
  config.last_call_timeout = 10s;
  config.join_timeout = 60s;
  Rendezvous original("job", config, clock);
  auto node = [](const std::string& id) { return NodeInfo{id, id + ".host", 1, 29500, -1}; };
  REQUIRE(original.join(node("a")));
  clock.advance(20s);
  REQUIRE(original.join(node("b")));  // min reached: the last call starts
  REQUIRE(original.next_deadline() == clock.now() + 10s);
  clock.advance(4s);
  const Json saved = original.save();

  // Another agent reads the state 3 s after it was written (by wall clock).
  clock.advance(3s);
  auto carried = Rendezvous::restore(saved, clock, {}, Rendezvous::Timers::kCarried);
  REQUIRE(carried);
  CHECK(carried.value()->next_deadline() == clock.now() + 3s);  // 10 - 4 - 3
  auto fresh = Rendezvous::restore(saved, clock);
  REQUIRE(fresh);
  CHECK(fresh.value()->next_deadline() == clock.now() + 6s);  // as the saved remainder says

  clock.advance(3s);
  auto formed = carried.value()->tick();
  CHECK(carried.value()->formed());
  REQUIRE(formed.size() == 2);
  // Each member reads the same assignment from the state as the notice that told it.
  for (const Notice& n : formed) {
    auto a = carried.value()->assignment(n.node_id);
    REQUIRE(a);
    CHECK(to_json(*a) == to_json(n.assignment));
  }
  CHECK_FALSE(carried.value()->assignment("nobody"));
  CHECK_FALSE(carried.value()->next_deadline());

  // A lone joiner's join_timeout counts from its join, not from the last restore.
  Rendezvous lonely("solo", config, clock);
  REQUIRE(lonely.join(node("c")));
  clock.advance(50s);
  const Json half = lonely.save();
  clock.advance(5s);
  auto later = Rendezvous::restore(half, clock, {}, Rendezvous::Timers::kCarried);
  REQUIRE(later);
  CHECK(later.value()->next_deadline() == clock.now() + 5s);
  clock.advance(5s);
  auto failed = later.value()->tick();
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].kind == Notice::Kind::kJoinFailed);
  CHECK_FALSE(later.value()->has_node("c"));
  auto why = later.value()->departure("c");
  REQUIRE(why);
  CHECK(why->find("did not form within join_timeout") != std::string::npos);
  // The reasons travel with the state.
  auto again = Rendezvous::restore(later.value()->save(), clock);
  REQUIRE(again);
  CHECK(again.value()->departure("c") == why);
}

TEST_CASE("state: a reopened round's reason is kept with the state") {
  ManualClock clock;
  RendezvousConfig config;
  config.min_nodes = 1;
  config.max_nodes = 2;
  config.last_call_timeout = 0s;
  Rendezvous r("job", config, clock);
  REQUIRE(r.join(NodeInfo{"a", "h", 1, 1, -1}));
  REQUIRE(r.formed());
  REQUIRE(r.join(NodeInfo{"b", "h", 1, 1, -1}));
  auto restored = Rendezvous::restore(r.save(), clock);
  REQUIRE(restored);
  CHECK(restored.value()->round() == 1);
  CHECK(restored.value()->open_reason() == "new node 'b' is waiting");
}

TEST_CASE("state: a restarted service has every key, round and result, and nodes resume") {
  MemoryStateLog log;
  {
    ServiceHarness first(recorded_by(log));
    auto a = first.connect_hello("job");
    auto b = first.connect_hello("job");
    REQUIRE(first.call(a, Json{{"op", "set"}, {"key", "k"}, {"value", to_binary("v1")}})["ok"]);
    REQUIRE(first.call(a, Json{{"op", "add"}, {"key", "n"}, {"delta", 5}})["value"] == 5);
    REQUIRE(first.call(a, Json{{"op", "set"}, {"key", "gone"}, {"value", to_binary("x")}})["ok"]);
    REQUIRE(first.call(a, Json{{"op", "delete"}, {"key", "gone"}})["deleted"] == true);
    first.send(a, with_id(join_request("a", 2, 2), 1));
    first.send(b, with_id(join_request("b", 2, 2), 1));
    REQUIRE(first.transport.take(a)["group_rank"] == 0);
    REQUIRE(first.transport.take(b)["group_rank"] == 1);
    REQUIRE(first.call(a, Json{{"op", "report"}, {"result", "succeeded"}})["ok"]);
    // The daemon dies here (no shutdown: nothing more is recorded).
  }
  ServiceHarness second(recorded_by(log));
  REQUIRE(second.service->restore());
  CHECK(mentions(second.logs, "restored 1 job(s), 2 key(s), 2 node(s)"));
  auto c = second.connect_hello("job");
  CHECK(second.call(c, Json{{"op", "get"}, {"key", "k"}})["value"] == to_binary("v1"));
  CHECK(second.call(c, Json{{"op", "add"}, {"key", "n"}, {"delta", 1}})["value"] == 6);
  CHECK(is_error(second.call(c, Json{{"op", "get"}, {"key", "gone"}, {"timeout_ms", 0}}),
                 "not_found"));
  Json status = second.call(c, Json{{"op", "status"}});
  CHECK(status["rendezvous"]["round"] == 0);
  CHECK(status["rendezvous"]["formed"] == true);

  // b comes back on a new connection and takes up its place: no new round.
  auto b = second.connect_hello("job");
  Json resumed = second.call(b, Json{{"op", "resume"}, {"node", "b"}});
  CHECK(resumed["ok"] == true);
  CHECK(resumed["round"] == 0);
  CHECK(resumed["state"] == "running");
  CHECK(is_error(second.call(c, Json{{"op", "resume"}, {"node", "stranger"}}), "not_found"));
  // a's result was kept: b's success ends the job as succeeded.
  CHECK(second.call(b, Json{{"op", "report"}, {"result", "succeeded"}})["ok"] == true);
  Json ended = second.transport.take(b);
  CHECK(ended["event"] == "job_ended");
  CHECK(ended["state"] == "succeeded");
}

TEST_CASE("state: a node that does not come back after a restart is dropped on keep-alive time") {
  MemoryStateLog log;
  {
    ServiceHarness first(recorded_by(log));
    auto a = first.connect_hello("job");
    auto b = first.connect_hello("job");
    Json ja = join_request("a", 1, 2);
    ja["keep_alive_interval_ms"] = 1000;
    ja["keep_alive_max_attempt"] = 2;
    ja["last_call_timeout_ms"] = 0;
    Json jb = ja;
    jb["node"] = "b";
    first.send(a, with_id(ja, 1));
    REQUIRE(first.transport.take(a)["group_rank"] == 0);
    first.send(b, with_id(jb, 1));  // a newcomer reopens the round, which forms with both
    REQUIRE(first.transport.take(a)["event"] == "round_reopened");
    first.send(a, with_id(ja, 2));
    REQUIRE(first.transport.take(a)["round"] == 1);
    REQUIRE(first.transport.take(b)["round"] == 1);
  }
  ServiceHarness second(recorded_by(log));
  REQUIRE(second.service->restore());
  auto a = second.connect_hello("job");
  REQUIRE(second.call(a, Json{{"op", "resume"}, {"node", "a"}})["ok"] == true);
  second.clock.advance(1500ms);
  second.call(a, Json{{"op", "keep_alive"}});
  second.service->tick();
  CHECK_FALSE(second.transport.has(a));  // within b's window
  second.clock.advance(1000ms);
  second.service->tick();
  Json reopened = second.transport.take(a);
  CHECK(reopened["event"] == "round_reopened");
  CHECK(reopened["reason"].get<std::string>().find("'b' left (no keep-alive") != std::string::npos);
}

TEST_CASE("state: the journal is compacted, and a failed append is repaired by a rewrite") {
  MemoryStateLog log;
  ServiceOptions options = recorded_by(log);
  options.compact_bytes = 2000;
  ServiceHarness h(options);
  auto c = h.connect_hello("job");
  for (int i = 0; i < 100; ++i) {
    REQUIRE(h.call(
        c, Json{{"op", "set"}, {"key", "k"}, {"value", to_binary(std::to_string(i))}})["ok"]);
  }
  CHECK(log.journal.size() == 100);
  h.service->tick();
  CHECK(log.rewrites == 1);
  CHECK(log.journal.empty());
  // One key, one (empty) rendezvous record: the snapshot holds the state, not the history.
  CHECK(log.snapshot.size() == 2);

  log.fail_appends = true;
  REQUIRE(h.call(c, Json{{"op", "set"}, {"key", "lost?"}, {"value", to_binary("no")}})["ok"]);
  CHECK(mentions(h.logs, "disk full; the whole state is rewritten at the next tick"));
  log.fail_appends = false;
  h.service->tick();
  CHECK(log.rewrites == 2);
  ServiceHarness restarted(recorded_by(log));
  REQUIRE(restarted.service->restore());
  auto r = restarted.connect_hello("job");
  CHECK(restarted.call(r, Json{{"op", "get"}, {"key", "lost?"}})["value"] == to_binary("no"));
  CHECK(restarted.call(r, Json{{"op", "get"}, {"key", "k"}})["value"] == to_binary("99"));
}

TEST_CASE("state: a daemon shutting down keeps its nodes in the recorded rendezvous") {
  MemoryStateLog log;
  {
    ServiceHarness first(recorded_by(log));
    auto a = first.connect_hello("job");
    first.send(a, with_id(join_request("a", 1, 1), 1));
    REQUIRE(first.transport.take(a)["group_rank"] == 0);
    first.service->shutdown();
    first.service->on_disconnect(a);
  }
  ServiceHarness second(recorded_by(log));
  REQUIRE(second.service->restore());
  auto a = second.connect_hello("job");
  CHECK(second.call(a, Json{{"op", "resume"}, {"node", "a"}})["ok"] == true);
}

TEST_CASE(
    "state: a join storm writes the rendezvous once, when its round forms, and a join "
    "nobody was answered is not kept") {
  MemoryStateLog log;
  ServiceHarness h(recorded_by(log));
  auto rdzv_records = [&log] {
    std::size_t n = 0;
    for (const auto& r : log.journal) n += r.value("t", "") == "rdzv";
    return n;
  };
  constexpr int kNodes = 64;
  std::vector<ConnectionId> nodes;
  for (int i = 0; i < kNodes; ++i) {
    nodes.push_back(h.connect_hello());
    h.send(nodes.back(), with_id(join_request("n" + std::to_string(i), kNodes, kNodes), 1));
    if (i + 1 < kNodes) CHECK(rdzv_records() == 0);  // waiting: nobody was told anything
  }
  CHECK(rdzv_records() == 1);  // the round formed: recorded before the answers went out
  for (auto id : nodes) CHECK(h.transport.take(id)["ok"] == true);

  // A node that waits (the round is full) was told nothing: nothing is written for it. A
  // restarted daemon knows the formed round, not the waiting node, whose resume then gets the
  // not_found that sends its agent to join again.
  const ConnectionId late = h.connect_hello();
  h.send(late, with_id(join_request("late", kNodes, kNodes), 1));
  CHECK_FALSE(h.transport.has(late));
  CHECK(rdzv_records() == 1);
  ServiceHarness restarted(recorded_by(log));
  REQUIRE(restarted.service->restore());
  const ConnectionId back = restarted.connect_hello();
  CHECK(restarted.call(back, {{"op", "resume"}, {"node", "n0"}})["ok"] == true);
  const ConnectionId never = restarted.connect_hello();
  CHECK(is_error(restarted.call(never, {{"op", "resume"}, {"node", "late"}}), "not_found"));
}
