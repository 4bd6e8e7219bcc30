// The per-step quorum, decision by decision, on a clock moved by hand.
#include "rendezvous/core/quorum.h"

#include "catch.h"

#include <map>

using namespace ctrun::rendezvous;
using namespace std::chrono_literals;

namespace {

QuorumConfig config(int min_replicas, int max_replicas = 0) {
  QuorumConfig c;
  c.min_replicas = min_replicas;
  c.max_replicas = max_replicas;
  c.join_timeout = 500ms;
  c.heartbeat_timeout = 2s;
  return c;
}

QuorumMember replica(const std::string& id, std::int64_t step = 0) {
  return QuorumMember{id, step, id + ".host:7000"};
}

// The notices as replica -> assignment.
std::map<std::string, QuorumAssignment> by_replica(const std::vector<QuorumNotice>& notices) {
  std::map<std::string, QuorumAssignment> out;
  for (const auto& n : notices) out[n.replica_id] = n.assignment;
  return out;
}

// a, b and c form quorum 1 at step `step`.
void form_three(Quorum& q, std::int64_t step = 0) {
  CHECK(q.ask(replica("a", step)).empty());
  CHECK(q.ask(replica("b", step)).empty());
  REQUIRE(q.ask(replica("c", step)).size() == 3);
  REQUIRE(q.quorum_id() == 1);
}

}  // namespace

TEST_CASE("quorum: the first forms once every replica of the job asked, or at the join timeout") {
  ManualClock clock;
  Quorum whole(config(1, 3), clock);
  form_three(whole);
  CHECK(whole.members().size() == 3);

  Quorum partial(config(1, 3), clock);
  CHECK(partial.ask(replica("a")).empty());
  CHECK(partial.ask(replica("b")).empty());
  CHECK(partial.why_waiting() == "gathering the first quorum for the join timeout");
  REQUIRE(partial.next_deadline().has_value());
  CHECK(*partial.next_deadline() == clock.now() + 500ms);
  clock.advance(499ms);
  CHECK(partial.tick().empty());
  clock.advance(1ms);
  auto formed = by_replica(partial.tick());
  REQUIRE(formed.size() == 2);
  CHECK(formed["a"].rank == 0);
  CHECK(formed["b"].rank == 1);
  CHECK(formed["a"].quorum_id == 1);
  CHECK(formed["a"].store_prefix == "quorum/1/");
  CHECK(formed["a"].members.at(1).address == "b.host:7000");
}

TEST_CASE("quorum: in steady state it forms as the last member asks, under the same id") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q);
  for (std::int64_t step = 1; step <= 3; ++step) {
    clock.advance(100ms);
    CHECK(q.ask(replica("c", step)).empty());
    CHECK(q.ask(replica("a", step)).empty());
    auto formed = by_replica(q.ask(replica("b", step)));
    REQUIRE(formed.size() == 3);
    CHECK(formed["b"].quorum_id == 1);  // same members: no new communicator
    CHECK(formed["b"].max_step == step);
    CHECK_FALSE(formed["b"].heal_from.has_value());
  }
  CHECK(q.waiting().empty());
  CHECK_FALSE(q.next_deadline().has_value());
}

TEST_CASE("quorum: a removed member is not waited for, and the rest form a new quorum at once") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q, 4);
  CHECK(q.ask(replica("a", 5)).empty());
  CHECK(q.ask(replica("b", 5)).empty());
  auto formed = by_replica(q.remove("c"));  // its connection closed: SIGKILLed
  REQUIRE(formed.size() == 2);
  CHECK(formed["a"].quorum_id == 2);
  CHECK(formed["a"].store_prefix == "quorum/2/");
  CHECK(formed["a"].members.size() == 2);
}

TEST_CASE("quorum: a silent member is waited for up to the join timeout, then left out") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q);
  clock.advance(100ms);
  CHECK(q.ask(replica("a", 1)).empty());
  CHECK(q.ask(replica("b", 1)).empty());
  CHECK(q.why_waiting() == "waiting for c until the join timeout");
  clock.advance(400ms);
  CHECK(q.tick().empty());
  clock.advance(100ms);
  auto formed = by_replica(q.tick());
  REQUIRE(formed.size() == 2);
  CHECK(formed["a"].quorum_id == 2);
  // c comes back a step behind: it joins the next quorum and heals from an up-to-date member.
  CHECK(q.ask(replica("c", 0)).empty());
  CHECK(q.ask(replica("a", 2)).empty());
  auto back = by_replica(q.ask(replica("b", 2)));
  REQUIRE(back.size() == 3);
  CHECK(back["c"].quorum_id == 3);
  CHECK(back["c"].max_step == 2);
  REQUIRE(back["c"].heal_from.has_value());
  CHECK(back["c"].members.at(static_cast<std::size_t>(*back["c"].heal_from)).step == 2);
  CHECK_FALSE(back["a"].heal_from.has_value());
}

TEST_CASE("quorum: a member dead by its heartbeat is not waited for") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q);
  // a and b keep proving life through a long step; c does not.
  for (int i = 0; i < 4; ++i) {
    clock.advance(600ms);
    q.heartbeat("a");
    q.heartbeat("b");
  }
  CHECK(q.ask(replica("a", 1)).empty());
  auto formed = by_replica(q.ask(replica("b", 1)));  // c is dead: not waited for
  REQUIRE(formed.size() == 2);
  CHECK(formed["a"].quorum_id == 2);
}

TEST_CASE("quorum: a minority of the last quorum gets none, however long it waits") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q);
  CHECK(q.remove("b").empty());
  CHECK(q.remove("c").empty());
  CHECK(q.ask(replica("a", 1)).empty());
  for (int i = 0; i < 10; ++i) {
    clock.advance(300ms);
    q.heartbeat("a");
    CHECK(q.tick().empty());
  }
  CHECK(q.why_waiting() ==
        "only 1 of the last quorum's 3 replicas asked: a quorum needs a majority of them (a "
        "partition's minority stops)");
  // b's replacement (the same replica slot) comes back: 2 of 3.
  auto formed = by_replica(q.ask(replica("b", 0)));
  REQUIRE(formed.size() == 2);
  CHECK(formed["b"].heal_from == 0);
  CHECK(q.quorum_id() == 2);
}

TEST_CASE("quorum: fewer than min_replicas get none, newcomers join the next formation") {
  ManualClock clock;
  Quorum q(config(2), clock);
  CHECK(q.ask(replica("a")).empty());
  clock.advance(1s);
  CHECK(q.tick().empty());
  CHECK(q.why_waiting() == "1 replicas asked, the quorum needs at least 2");
  auto first = q.ask(replica("b"));
  REQUIRE(first.size() == 2);  // the join timeout passed since a's ask
  // Two newcomers while a and b train: taken in when a and b next ask, behind by 3 steps;
  // sources round-robin over the two up-to-date members.
  CHECK(q.ask(replica("x", 0)).empty());
  CHECK(q.ask(replica("y", 0)).empty());
  CHECK(q.ask(replica("a", 3)).empty());
  auto grown = by_replica(q.ask(replica("b", 3)));
  REQUIRE(grown.size() == 4);
  CHECK(grown["a"].quorum_id == 2);
  REQUIRE(grown["x"].heal_from.has_value());
  REQUIRE(grown["y"].heal_from.has_value());
  CHECK(*grown["x"].heal_from != *grown["y"].heal_from);
  CHECK(grown["x"].members.at(static_cast<std::size_t>(*grown["x"].heal_from)).step == 3);
}

TEST_CASE("quorum: answers round-trip through JSON and malformed ones are refused by field") {
  QuorumAssignment a;
  a.quorum_id = 7;
  a.members = {replica("a", 3), replica("b", 1)};
  a.rank = 1;
  a.max_step = 3;
  a.heal_from = 0;
  a.store_prefix = "quorum/7/";
  auto back = quorum_assignment_from_json(to_json(a));
  REQUIRE(back.ok());
  CHECK(back.value().quorum_id == 7);
  CHECK(back.value().rank == 1);
  CHECK(back.value().heal_from == 0);
  CHECK(back.value().members.at(1).address == "b.host:7000");

  Json bad_rank = to_json(a);
  bad_rank["rank"] = 2;
  CHECK(quorum_assignment_from_json(bad_rank).error().message ==
        "quorum answer: 'rank' 2 is not a member");
  Json no_members = to_json(a);
  no_members["members"] = Json::array();
  CHECK_FALSE(quorum_assignment_from_json(no_members).ok());
  CHECK_FALSE(quorum_assignment_from_json(Json::array()).ok());

  QuorumConfig c = config(3, 2);
  CHECK(validate(c).error().message == "quorum: max_replicas (2) is below min_replicas (3)");
  CHECK_FALSE(validate(config(0)).ok());
  CHECK(validate(config(1)).ok());
}

TEST_CASE("quorum: a replica waiting for its answer is alive however long the wait") {
  ManualClock clock;
  Quorum q(config(2), clock);
  CHECK(q.ask(replica("a")).empty());
  for (int i = 0; i < 10; ++i) {
    clock.advance(1s);  // five heartbeat timeouts: a is blocked in its ask and cannot beat
    CHECK(q.tick().empty());
  }
  CHECK(q.waiting() == std::vector<std::string>{"a"});
  auto formed = by_replica(q.ask(replica("b")));
  REQUIRE(formed.size() == 2);
  CHECK(formed.count("a") == 1);
  // A waited-for member's silence is a deadline; one already past is not.
  CHECK(q.ask(replica("a", 1)).empty());
  REQUIRE(q.next_deadline().has_value());
  CHECK(*q.next_deadline() == clock.now() + 500ms);
  q.heartbeat("b");
  clock.advance(100ms);
  CHECK(q.ask(replica("a", 1)).empty());  // a second ask replaces the first
  CHECK(*q.next_deadline() > clock.now());
}

TEST_CASE("quorum: an ask with rebuild gives the next quorum a new id though its members stay") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q);
  CHECK(q.ask(replica("a", 1)).empty());
  CHECK(q.ask(replica("b", 1), /*rebuild=*/true).empty());
  auto rebuilt = by_replica(q.ask(replica("c", 1)));
  REQUIRE(rebuilt.size() == 3);
  CHECK(rebuilt["a"].quorum_id == 2);
  CHECK(rebuilt["a"].store_prefix == "quorum/2/");
  // Asked once: the formation after it keeps the id again.
  CHECK(q.ask(replica("a", 2)).empty());
  CHECK(q.ask(replica("b", 2)).empty());
  CHECK(by_replica(q.ask(replica("c", 2)))["c"].quorum_id == 2);

  QuorumRequest request;
  request.member = replica("a", 4);
  request.rebuild = true;
  auto back = quorum_request_from_json(to_json(request));
  REQUIRE(back.ok());
  CHECK(back.value().rebuild);
  Json no_flag = to_json(request);
  no_flag.erase("rebuild");
  CHECK_FALSE(quorum_request_from_json(no_flag).value().rebuild);
  Json bad_flag = to_json(request);
  bad_flag["rebuild"] = "yes";
  CHECK(quorum_request_from_json(bad_flag).error().message ==
        "field 'rebuild' must be true or false");
}

TEST_CASE("quorum: heal_sources spreads the behind members round-robin over the up-to-date") {
  const std::vector<QuorumMember> members = {replica("a", 5), replica("b", 2), replica("c", 5),
                                             replica("d", 0), replica("e", 4)};
  const auto sources = heal_sources(members);
  REQUIRE(sources.size() == 5);
  CHECK_FALSE(sources[0].has_value());
  CHECK(sources[1] == 0);
  CHECK_FALSE(sources[2].has_value());
  CHECK(sources[3] == 2);
  CHECK(sources[4] == 0);
  // What each member is told agrees with the plan every member computes.
  ManualClock clock;
  Quorum q(config(1, 5), clock);
  std::map<std::string, QuorumAssignment> formed;
  for (const auto& m : members) formed = by_replica(q.ask(m));
  REQUIRE(formed.size() == 5);
  for (std::size_t i = 0; i < members.size(); ++i) {
    CHECK(formed[members[i].replica_id].heal_from == sources[i]);
  }
  CHECK(heal_sources({replica("a", 3), replica("b", 3)}) ==
        std::vector<std::optional<int>>{std::nullopt, std::nullopt});
}

TEST_CASE("quorum: once a replica finished the training every ask learns it at once") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  form_three(q);
  CHECK(q.ask(replica("b", 7)).empty());  // waits for a and c
  auto finished = by_replica(q.finish(replica("a", 8)));
  REQUIRE(finished.size() == 2);  // a itself and the waiting b
  CHECK(finished["a"].finished);
  CHECK(finished["b"].finished);
  CHECK(finished["b"].max_step == 8);
  CHECK(finished["b"].members.size() == 1);
  CHECK(q.finished_step() == 8);
  // A replacement started after the end is not kept waiting for a quorum that cannot form.
  auto late = by_replica(q.ask(replica("c", 0)));
  REQUIRE(late.size() == 1);
  CHECK(late["c"].finished);
  CHECK(q.waiting().empty());
  CHECK(q.describe()["finished_step"] == 8);

  auto back = quorum_assignment_from_json(to_json(late["c"]));
  REQUIRE(back.ok());
  CHECK(back.value().finished);
  CHECK_FALSE(
      quorum_assignment_from_json(to_json(QuorumAssignment{0, {replica("x")}, 0, 0, {}, ""}))
          .value()
          .finished);
}

TEST_CASE("quorum: formations count every formation, and each member's assignment stays readable") {
  ManualClock clock;
  Quorum q(config(1, 3), clock);
  CHECK(q.formations() == 0);
  form_three(q, 4);
  for (const char* id : {"a", "b", "c"})
    CHECK(q.ask(replica(id, 5)).size() == (id[0] == 'c' ? 3u : 0u));
  CHECK(q.quorum_id() == 1);  // the same members: the same id, but a second formation
  CHECK(q.formations() == 2);
  const auto b = q.assignment("b");
  REQUIRE(b.has_value());
  CHECK(b->rank == 1);
  CHECK(b->max_step == 5);
  CHECK(b->store_prefix == "quorum/1/");
  CHECK_FALSE(q.assignment("z").has_value());
}

TEST_CASE("quorum: saved and restored it decides as before, the join timeout running on") {
  ManualClock writer;
  Quorum q(config(2, 3), writer, "quorum/abc/");
  form_three(q, 3);
  q.ask(replica("a", 4), /*rebuild=*/true);
  q.remove("c");
  writer.advance(300ms);  // a's ask has waited 300 of its 500 ms for b
  const Json saved = q.save();
  CHECK(saved.at("formations") == 1);

  // Restored by another replica whose wall clock reads 100 ms later.
  ManualClock reader;
  reader.advance(std::chrono::milliseconds(writer.unix_millis() - reader.unix_millis()) + 100ms);
  auto restored = Quorum::restore(saved, reader);
  REQUIRE(restored);
  Quorum& r = *restored.value();
  CHECK(r.quorum_id() == 1);
  CHECK(r.formations() == 1);
  CHECK(r.waiting() == std::vector<std::string>{"a"});
  CHECK(r.known() == std::vector<std::string>{"a", "b"});  // c was removed
  CHECK(r.config().min_replicas == 2);
  REQUIRE(r.next_deadline().has_value());
  CHECK(*r.next_deadline() == reader.now() + 100ms);  // 500 - 300 waited - 100 since saved
  // b asks: a and b are a majority of a, b, c (c removed): the rebuild gives a new id.
  auto formed = by_replica(r.ask(replica("b", 4)));
  REQUIRE(formed.size() == 2);
  CHECK(formed["a"].quorum_id == 2);
  CHECK(formed["a"].store_prefix == "quorum/abc/2/");
  CHECK(r.formations() == 2);

  // What save() wrote and nothing else is read back.
  Json damaged = saved;
  damaged.erase("members");
  auto refused = Quorum::restore(damaged, reader);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.rfind("saved quorum: ", 0) == 0);
  Json invalid = saved;
  invalid["min_replicas"] = 0;
  CHECK_FALSE(Quorum::restore(invalid, reader));
}
