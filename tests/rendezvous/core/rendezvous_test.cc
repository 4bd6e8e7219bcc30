#include "rendezvous/core/rendezvous.h"

#include <algorithm>

#include "catch.h"

using namespace ctrun::rendezvous;
using namespace std::chrono_literals;

namespace {

RendezvousConfig nodes(int min, int max) {
  RendezvousConfig c;
  c.min_nodes = min;
  c.max_nodes = max;
  c.keep_alive_interval = std::chrono::hours(1);  // tests of keep-alives set their own
  return c;
}

NodeInfo node(const std::string& id, int local_world_size = 1, int requested_rank = -1) {
  return NodeInfo{id, id + ".host", local_world_size, 29500, requested_rank};
}

std::vector<Notice> of_kind(const std::vector<Notice>& all, Notice::Kind kind) {
  std::vector<Notice> out;
  std::copy_if(all.begin(), all.end(), std::back_inserter(out),
               [kind](const Notice& n) { return n.kind == kind; });
  return out;
}

const Notice* for_node(const std::vector<Notice>& all, const std::string& id) {
  for (const auto& n : all) {
    if (n.node_id == id) return &n;
  }
  return nullptr;
}

std::vector<Notice> join_ok(Rendezvous& r, const NodeInfo& info) {
  auto result = r.join(info);
  REQUIRE(result.ok());
  return result.value();
}

int rank_of(const std::vector<Notice>& formed, const std::string& id) {
  const Notice* n = for_node(formed, id);
  REQUIRE(n != nullptr);
  REQUIRE(n->kind == Notice::Kind::kRoundFormed);
  return n->assignment.group_rank;
}

}  // namespace

TEST_CASE("rendezvous: config validation") {
  CHECK(validate(nodes(1, 1)).ok());
  CHECK_FALSE(validate(nodes(0, 1)).ok());
  CHECK_FALSE(validate(nodes(3, 2)).ok());
  auto c = nodes(1, 2);
  c.keep_alive_max_attempt = 0;
  CHECK_FALSE(validate(c).ok());
}

TEST_CASE("rendezvous: a round closes at max nodes at once") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 2), clock);
  CHECK(join_ok(r, node("a", 4)).empty());
  CHECK_FALSE(r.formed());
  auto formed = join_ok(r, node("b", 2));
  REQUIRE(formed.size() == 2);
  REQUIRE(r.formed());
  CHECK(r.round() == 0);
  const auto& a = for_node(formed, "a")->assignment;
  const auto& b = for_node(formed, "b")->assignment;
  CHECK(a.group_rank == 0);
  CHECK(b.group_rank == 1);
  CHECK(a.group_world_size == 2);
  // Rank offsets come from each node's local world size.
  CHECK(a.rank_offset == 0);
  CHECK(b.rank_offset == 4);
  CHECK(a.world_size == 6);
  CHECK(b.world_size == 6);
  // Everyone is told group rank 0's address and port.
  CHECK(b.master_addr == "a.host");
  CHECK(b.master_port == 29500);
  CHECK(a.store_prefix == b.store_prefix);
  CHECK(a.store_prefix == "rdzv/0/0/");
  CHECK(r.describe()["nodes"].size() == 2);
}

TEST_CASE("rendezvous: between min and max the round waits for the last call") {
  ManualClock clock;
  auto config = nodes(2, 4);
  config.last_call_timeout = 30s;
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  CHECK_FALSE(r.formed());
  clock.advance(10s);
  CHECK(r.tick().empty());
  join_ok(r, node("c"));  // joins during the last call, does not extend it
  clock.advance(19s);
  CHECK(r.tick().empty());
  clock.advance(1s);
  auto formed = r.tick();
  REQUIRE(formed.size() == 3);
  CHECK(r.formed());
  CHECK(for_node(formed, "c")->assignment.group_world_size == 3);
}

TEST_CASE("rendezvous: falling below min cancels the last call") {
  ManualClock clock;
  auto config = nodes(2, 3);
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  r.remove_node("b", "connection closed");
  clock.advance(31s);
  CHECK(r.tick().empty());
  CHECK_FALSE(r.formed());
}

TEST_CASE("rendezvous: join timeout fails a round that never reaches min") {
  ManualClock clock;
  auto config = nodes(3, 3);
  config.join_timeout = 60s;
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  clock.advance(30s);
  join_ok(r, node("b"));
  clock.advance(30s);
  auto out = r.tick();
  auto failed = of_kind(out, Notice::Kind::kJoinFailed);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].node_id == "a");
  CHECK(failed[0].error.code == ErrorCode::kTimeout);
  CHECK(failed[0].error.message.find("join_timeout") != std::string::npos);
  CHECK_FALSE(r.has_node("a"));
  CHECK(r.has_node("b"));
}

TEST_CASE("rendezvous: a lost member reopens the round, survivors keep their ranks") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 3), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  auto formed = join_ok(r, node("c"));
  REQUIRE(r.formed());
  CHECK(rank_of(formed, "c") == 2);

  auto reopened = r.remove_node("b", "connection closed");
  REQUIRE(reopened.size() == 2);
  for (const auto& n : reopened) {
    CHECK(n.kind == Notice::Kind::kRoundReopened);
    CHECK(n.round == 1);
    CHECK(n.reason.find("'b'") != std::string::npos);
  }
  CHECK_FALSE(r.formed());
  CHECK(r.round() == 1);
  // Survivors rejoin (in any order): once all are back the round forms without a last call.
  CHECK(join_ok(r, node("c")).empty());
  auto again = join_ok(r, node("a"));
  REQUIRE(again.size() == 2);
  CHECK(rank_of(again, "a") == 0);
  CHECK(rank_of(again, "c") == 1);  // rank 2 no longer exists: next free
  CHECK(for_node(again, "a")->assignment.store_prefix == "rdzv/0/1/");
}

TEST_CASE("rendezvous: a restarting member opens a new round with stable ranks") {
  ManualClock clock;
  Rendezvous r("job", nodes(3, 3), clock);
  for (auto id : {"x", "y", "z"}) join_ok(r, node(id));
  REQUIRE(r.formed());
  r.set_round_restart_count(0);
  auto out = join_ok(r, node("y"));  // y's worker failed: it joins again
  auto reopened = of_kind(out, Notice::Kind::kRoundReopened);
  REQUIRE(reopened.size() == 2);  // x and z are told; y knows
  CHECK_FALSE(for_node(reopened, "y"));
  join_ok(r, node("z"));
  auto formed = join_ok(r, node("x"));
  CHECK(rank_of(formed, "x") == 0);
  CHECK(rank_of(formed, "y") == 1);
  CHECK(rank_of(formed, "z") == 2);
  CHECK(r.round() == 1);
  // The new round's restart count is its own, unset until its forming write sets it.
  CHECK(r.round_restart_count_unset());
  CHECK(for_node(formed, "x")->assignment.restart_count == -1);
  r.set_round_restart_count(1);
  CHECK(r.assignment("z")->restart_count == 1);
}

TEST_CASE("rendezvous: static ranks are honoured whatever the join order") {
  ManualClock clock;
  Rendezvous r("job", nodes(3, 3), clock);
  join_ok(r, node("n2", 1, 2));
  join_ok(r, node("n0", 1, 0));
  auto formed = join_ok(r, node("n1", 1, 1));
  CHECK(rank_of(formed, "n0") == 0);
  CHECK(rank_of(formed, "n1") == 1);
  CHECK(rank_of(formed, "n2") == 2);
  CHECK(for_node(formed, "n2")->assignment.master_addr == "n0.host");
}

TEST_CASE("rendezvous: a taken or impossible static rank is refused") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 2), clock);
  join_ok(r, node("a", 1, 0));
  auto taken = r.join(node("b", 1, 0));
  REQUIRE_FALSE(taken);
  CHECK(taken.error().code == ErrorCode::kConflict);
  CHECK(taken.error().message.find("already taken by node 'a'") != std::string::npos);
  auto too_big = r.join(node("c", 1, 2));
  REQUIRE_FALSE(too_big);
  CHECK(too_big.error().code == ErrorCode::kConflict);
  auto bad_size = r.join(node("d", 0));
  REQUIRE_FALSE(bad_size);
  CHECK(bad_size.error().code == ErrorCode::kBadRequest);
}

TEST_CASE("rendezvous: a newcomer waits when the round is full") {
  ManualClock clock;
  Rendezvous r("job", nodes(1, 2), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  REQUIRE(r.formed());
  CHECK(join_ok(r, node("late")).empty());  // nothing reopens
  CHECK(r.nodes_waiting() == 1);
  // When a member fails, the waiting node takes the seat.
  auto out = r.remove_node("a", "connection closed");
  REQUIRE(of_kind(out, Notice::Kind::kRoundReopened).size() == 1);
  auto formed = join_ok(r, node("b"));
  REQUIRE(formed.size() == 2);
  CHECK(rank_of(formed, "b") == 1);  // survivor keeps its rank
  CHECK(rank_of(formed, "late") == 0);
}

TEST_CASE("rendezvous: a newcomer below max opens the next round") {
  ManualClock clock;
  auto config = nodes(1, 3);
  config.last_call_timeout = 5s;
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  clock.advance(5s);
  REQUIRE(r.tick().size() == 1);
  REQUIRE(r.formed());
  auto out = join_ok(r, node("b"));
  auto reopened = of_kind(out, Notice::Kind::kRoundReopened);
  REQUIRE(reopened.size() == 1);
  CHECK(reopened[0].node_id == "a");
  CHECK(reopened[0].reason.find("new node 'b'") != std::string::npos);
  auto formed = join_ok(r, node("a"));
  REQUIRE(formed.size() == 2);  // survivor back: no last call
  CHECK(rank_of(formed, "a") == 0);
  CHECK(rank_of(formed, "b") == 1);
  CHECK(for_node(formed, "b")->assignment.world_size == 2);
}

TEST_CASE("rendezvous: silent nodes are dropped after keep_alive_max_attempt intervals") {
  ManualClock clock;
  auto config = nodes(2, 2);
  config.keep_alive_interval = 5s;
  config.keep_alive_max_attempt = 3;
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  for (int i = 0; i < 4; ++i) {
    clock.advance(5s);
    r.keep_alive("a");
    CHECK(r.tick().empty() == (i < 3));  // b silent for 15 s is still fine, 20 s is not
  }
  CHECK_FALSE(r.has_node("b"));
  CHECK(r.has_node("a"));
  CHECK(r.round() == 1);
}

TEST_CASE("rendezvous: one failure ends the job and later joins are refused") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 3), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  clock.advance(30s);
  r.tick();
  REQUIRE(r.formed());
  join_ok(r, node("c"));  // reopens; c pending, a and b stale
  auto report = r.report("a", false, "exit code 3");
  REQUIRE(report);
  CHECK(r.state() == JobState::kFailed);
  auto ended = of_kind(report.value(), Notice::Kind::kJobEnded);
  auto refused = of_kind(report.value(), Notice::Kind::kJoinFailed);
  CHECK(ended.size() == 2);
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].node_id == "c");
  CHECK(refused[0].error.code == ErrorCode::kClosed);
  auto late = r.join(node("d"));
  REQUIRE_FALSE(late);
  CHECK(late.error().code == ErrorCode::kClosed);
  CHECK(late.error().message.find("exit code 3") != std::string::npos);
}

TEST_CASE("rendezvous: the job succeeds when every member succeeded") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 2), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  auto first = r.report("a", true, "");
  REQUIRE(first);
  CHECK(first.value().empty());
  CHECK(r.state() == JobState::kRunning);
  // A finished node that disconnects does not reopen the round.
  CHECK(r.remove_node("a", "connection closed").empty());
  auto second = r.report("b", true, "");
  REQUIRE(second);
  CHECK(r.state() == JobState::kSucceeded);
  CHECK(of_kind(second.value(), Notice::Kind::kJobEnded).size() == 2);
  auto stranger = r.report("zz", true, "");
  CHECK_FALSE(stranger);
}

TEST_CASE("rendezvous: close ends the job and refuses waiting joiners") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 2), clock);
  join_ok(r, node("a"));
  auto out = r.close("closed by operator");
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind == Notice::Kind::kJoinFailed);
  CHECK(out[0].error.code == ErrorCode::kClosed);
  CHECK(r.state() == JobState::kClosed);
  CHECK(r.close("again").empty());
}

TEST_CASE("rendezvous: more pending nodes than max: the rest wait") {
  ManualClock clock;
  auto config = nodes(1, 2);
  config.last_call_timeout = 1s;
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  auto formed = join_ok(r, node("b"));
  REQUIRE(formed.size() == 2);
  join_ok(r, node("c"));
  CHECK(r.nodes_waiting() == 1);
  auto d = r.describe();
  CHECK(d["nodes_waiting"] == 1);
  CHECK(d["state"] == "running");
  CHECK(d["nodes"].size() == 3);
}

TEST_CASE("rendezvous: a join request survives a JSON round trip and its fields are bounded") {
  JoinRequest original;
  original.node = NodeInfo{"n1", "10.0.0.5", 8, 29500, 3};
  original.config.min_nodes = 2;
  original.config.max_nodes = 4;
  original.config.join_timeout = 90s;
  original.config.keep_alive_max_attempt = 7;
  auto back = join_request_from_json(to_json(original));
  REQUIRE(back);
  CHECK(back.value().node.node_id == "n1");
  CHECK(back.value().node.host == "10.0.0.5");
  CHECK(back.value().node.local_world_size == 8);
  CHECK(back.value().node.master_port == 29500);
  CHECK(back.value().node.requested_rank == 3);
  CHECK(back.value().config.min_nodes == 2);
  CHECK(back.value().config.max_nodes == 4);
  CHECK(back.value().config.join_timeout == 90s);
  CHECK(back.value().config.keep_alive_max_attempt == 7);

  Json too_many = to_json(original);
  too_many["local_world_size"] = 4097;
  auto refused = join_request_from_json(too_many);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message == "field 'local_world_size' is outside -1..4096");
  Json no_host = to_json(original);
  no_host.erase("host");
  CHECK_FALSE(join_request_from_json(no_host));
  Json optional_left_out = to_json(original);
  optional_left_out.erase("requested_rank");
  CHECK(join_request_from_json(optional_left_out).value().node.requested_rank == -1);
  CHECK_FALSE(join_request_from_json(Json::parse("not json", nullptr, false)));
}

TEST_CASE("rendezvous: assignment survives a JSON round trip") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 2), clock, {}, 7);
  join_ok(r, node("a", 2));
  auto formed = join_ok(r, node("b", 3));
  const auto& original = for_node(formed, "b")->assignment;
  CHECK(original.store_prefix == "rdzv/7/0/");
  auto back = round_assignment_from_json(to_json(original));
  REQUIRE(back);
  CHECK(back.value().rank_offset == 2);
  CHECK(back.value().world_size == 5);
  CHECK(back.value().group_rank == 1);
  CHECK(back.value().master_addr == "a.host");
  auto broken = to_json(original);
  broken.erase("world_size");
  CHECK_FALSE(round_assignment_from_json(broken));
}

TEST_CASE("rendezvous: a silent joiner still gets an answer to its join") {
  ManualClock clock;
  auto config = nodes(2, 2);
  config.keep_alive_interval = 1s;
  config.keep_alive_max_attempt = 2;
  Rendezvous r("job", config, clock);
  join_ok(r, node("a"));
  clock.advance(3s);
  auto out = r.tick();
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind == Notice::Kind::kJoinFailed);
  CHECK(out[0].node_id == "a");
  CHECK(out[0].error.message.find("no keep-alive") != std::string::npos);
  CHECK_FALSE(r.has_node("a"));
}

TEST_CASE("rendezvous: with no last call, a reopened round waits for its survivors") {
  // Forming at once without the survivors would make each returning survivor a newcomer that
  // reopens the round again, forever.
  ManualClock clock;
  auto config = nodes(1, 2);
  config.last_call_timeout = Duration::zero();
  Rendezvous r("job", config, clock);
  REQUIRE(join_ok(r, node("a")).size() == 1);  // forms alone at once
  auto out = join_ok(r, node("b"));
  CHECK(of_kind(out, Notice::Kind::kRoundFormed).empty());
  REQUIRE(of_kind(out, Notice::Kind::kRoundReopened).size() == 1);
  auto formed = join_ok(r, node("a"));
  REQUIRE(formed.size() == 2);
  CHECK(r.round() == 1);
  CHECK(rank_of(formed, "a") == 0);
  CHECK(r.formed());
}

TEST_CASE("rendezvous: a survivor that vanishes instead of rejoining is not waited for") {
  ManualClock clock;
  Rendezvous r("job", nodes(1, 3), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  join_ok(r, node("c"));
  REQUIRE(r.formed());
  r.remove_node("a", "connection closed");  // b, c stale
  CHECK(join_ok(r, node("b")).empty());     // waits for c
  auto formed = r.remove_node("c", "connection closed");
  REQUIRE(formed.size() == 1);
  CHECK(formed[0].kind == Notice::Kind::kRoundFormed);
  CHECK(formed[0].node_id == "b");
}

TEST_CASE("rendezvous: a member lost after every other one succeeded ends the job, succeeded") {
  ManualClock clock;
  Rendezvous r("job", nodes(2, 3), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  join_ok(r, node("c"));
  REQUIRE(r.formed());
  REQUIRE(r.report("a", true, ""));
  REQUIRE(r.report("b", true, ""));
  CHECK(r.state() == JobState::kRunning);
  // c's machine died; its lease (or keep-alives) ran out only after a and b had finished:
  // nobody is left to form another round, and the finished nodes hear that the job ended.
  auto out = r.remove_node("c", "its etcd lease expired");
  CHECK(r.state() == JobState::kSucceeded);
  CHECK(for_node(out, "a") != nullptr);
  CHECK(for_node(out, "b") != nullptr);
  CHECK(of_kind(out, Notice::Kind::kJobEnded).size() == 2);
}

TEST_CASE("rendezvous: a member that already succeeded is not waited for after a reopen") {
  ManualClock clock;
  Rendezvous r("job", nodes(1, 3), clock);
  join_ok(r, node("a"));
  join_ok(r, node("b"));
  join_ok(r, node("c"));
  REQUIRE(r.formed());
  REQUIRE(r.report("a", true, ""));
  auto reopened = r.remove_node("b", "connection closed");
  // a finished: only c is told to rejoin, and the round forms with c alone.
  REQUIRE(reopened.size() == 1);
  CHECK(reopened[0].node_id == "c");
  auto formed = join_ok(r, node("c"));
  REQUIRE(formed.size() == 1);
  CHECK(formed[0].assignment.world_size == 1);
  auto end = r.report("c", true, "");
  REQUIRE(end);
  CHECK(r.state() == JobState::kSucceeded);
  // The finished node hears of the end too.
  CHECK(for_node(end.value(), "a") != nullptr);
}
