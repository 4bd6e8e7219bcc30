// ctrund's `quorum` op in memory: replicas ask per step, answers come when the quorum forms, a
// closed connection takes its replica out, and bad asks are refused by field.
#include "catch.h"

#include "ctrun/rendezvous/quorum.h"
#include "service_harness.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;
using namespace std::chrono_literals;

namespace {

Json ask(const std::string& replica, std::int64_t step, int id, int max_replicas = 3) {
  QuorumRequest r;
  r.member = QuorumMember{replica, step, replica + ".host:7000"};
  r.config.min_replicas = 1;
  r.config.max_replicas = max_replicas;
  r.config.join_timeout = 300ms;
  r.config.heartbeat_timeout = 2s;
  Json j = to_json(r);
  j["op"] = "quorum";
  j["id"] = id;
  return j;
}

QuorumAssignment answer(ServiceHarness& h, ConnectionId c) {
  REQUIRE(h.transport.has(c));
  Json frame = h.transport.take(c);
  INFO(frame.dump());
  REQUIRE(frame.value("ok", false));
  auto a = quorum_assignment_from_json(frame);
  REQUIRE(a.ok());
  return a.value();
}

}  // namespace

TEST_CASE("service quorum: answers come when the quorum forms, on each step") {
  ServiceHarness h;
  const ConnectionId a = h.connect_hello();
  const ConnectionId b = h.connect_hello();
  const ConnectionId c = h.connect_hello();
  h.send(a, ask("a", 0, 1));
  h.send(b, ask("b", 0, 1));
  CHECK_FALSE(h.transport.has(a));
  h.send(c, ask("c", 0, 1));
  const QuorumAssignment first = answer(h, a);
  CHECK(first.quorum_id == 1);
  CHECK(first.members.size() == 3);
  CHECK(first.rank == 0);
  CHECK(first.store_prefix.rfind("quorum/", 0) == 0);
  CHECK(answer(h, b).rank == 1);
  CHECK(answer(h, c).rank == 2);

  // The next step: same members, same id and prefix.
  for (ConnectionId conn : {a, b, c}) {
    const std::string name = conn == a ? "a" : conn == b ? "b" : "c";
    h.send(conn, ask(name, 1, 2));
  }
  const QuorumAssignment second = answer(h, c);
  CHECK(second.quorum_id == 1);
  CHECK(second.store_prefix == first.store_prefix);
  CHECK(second.max_step == 1);
  CHECK(answer(h, a).quorum_id == 1);
  CHECK(answer(h, b).quorum_id == 1);

  Json status = h.call(a, Json{{"op", "status"}});
  CHECK(status["quorum"]["quorum_id"] == 1);
  CHECK(status["quorum"]["members"].size() == 3);
}

TEST_CASE("service quorum: a replica whose connection closes is not waited for") {
  ServiceHarness h;
  const ConnectionId a = h.connect_hello();
  const ConnectionId b = h.connect_hello();
  const ConnectionId c = h.connect_hello();
  h.send(a, ask("a", 0, 1));
  h.send(b, ask("b", 0, 1));
  h.send(c, ask("c", 0, 1));
  for (ConnectionId conn : {a, b, c}) answer(h, conn);

  h.send(a, ask("a", 1, 2));
  h.send(b, ask("b", 1, 2));
  CHECK_FALSE(h.transport.has(a));
  h.service->on_disconnect(c);  // its worker was SIGKILLed: the kernel closed the socket
  const QuorumAssignment shrunk = answer(h, a);
  CHECK(shrunk.quorum_id == 2);
  CHECK(shrunk.members.size() == 2);
  CHECK(mentions(h.logs, "quorum replica 'c' gone (its connection closed)"));

  // Its replacement asks on a new connection, a step behind: it heals from a or b.
  const ConnectionId c2 = h.connect_hello();
  h.send(c2, ask("c", 0, 1));
  h.send(a, ask("a", 2, 3));
  h.send(b, ask("b", 2, 3));
  const QuorumAssignment back = answer(h, c2);
  CHECK(back.quorum_id == 3);
  REQUIRE(back.heal_from.has_value());
  CHECK(back.members.at(static_cast<std::size_t>(*back.heal_from)).step == 2);
}

TEST_CASE("service quorum: the join timeout passes on the daemon's tick, a newer ask supersedes") {
  ServiceHarness h;
  const ConnectionId a = h.connect_hello();
  h.send(a, ask("a", 0, 1));
  h.service->tick();
  CHECK_FALSE(h.transport.has(a));
  h.clock.advance(300ms);
  h.service->tick();
  CHECK(answer(h, a).members.size() == 1);

  // An ask that timed out on the client's side is superseded by its next one.
  const ConnectionId b = h.connect_hello();
  h.send(b, ask("b", 0, 5));  // waits: a has not asked again
  const ConnectionId b2 = h.connect_hello();
  h.send(b2, ask("b", 0, 6));
  Json superseded = h.transport.take(b);
  CHECK(superseded["id"] == 5);
  CHECK(is_error(superseded, "conflict"));
}

TEST_CASE("service quorum: bad asks are refused by field, other timeouts are a conflict") {
  ServiceHarness h;
  const ConnectionId a = h.connect_hello();
  Json no_replica = ask("a", 0, 1);
  no_replica.erase("replica");
  h.send(a, no_replica);
  CHECK(is_error(h.transport.take(a), "bad_request"));  // and the connection is closed

  const ConnectionId b = h.connect_hello();
  Json negative = ask("b", -1, 2);
  h.send(b, negative);
  Json refused = h.transport.take(b);
  CHECK(is_error(refused, "bad_request"));
  CHECK(refused["error"]["message"] == "field 'step' is outside 0..4611686018427387904");

  const ConnectionId c = h.connect_hello();
  h.send(c, ask("c", 0, 3, 3));
  const ConnectionId d = h.connect_hello();
  Json other_timeout = ask("d", 0, 4);
  other_timeout["join_timeout_ms"] = 999;
  h.send(d, other_timeout);
  Json conflict = h.transport.take(d);
  CHECK(is_error(conflict, "conflict"));
  CHECK(conflict["error"]["message"].get<std::string>().find("join timeout 300 ms") !=
        std::string::npos);
  // max_replicas counts only for the first quorum: a replica started in a later, larger round
  // (another WORLD_SIZE) is not refused for it.
  const ConnectionId e = h.connect_hello();
  h.send(e, ask("e", 0, 5, 8));
  CHECK_FALSE(h.transport.has(e));

  Json beat = h.call(c, Json{{"op", "quorum_heartbeat"}, {"replica", "c"}});
  CHECK(beat.value("ok", false));
  // Not for a replica the connection does not speak for (d's ask was refused).
  CHECK(is_error(h.call(c, Json{{"op", "quorum_heartbeat"}, {"replica", "d"}}), "not_found"));
}
