// ctrund's pushed frames as the typed events every backend gives its agent.
#include "catch.h"

#include "rendezvous/backend/backend.h"

using namespace ctrun::rendezvous;

TEST_CASE("backend events: ctrund's frames become typed events") {
  auto reopened = backend_event_from_frame(
      Json{{"event", "round_reopened"}, {"job", "j"}, {"round", 3}, {"reason", "node lost"}});
  REQUIRE(reopened);
  CHECK(reopened->kind == BackendEvent::Kind::kRoundReopened);
  CHECK(reopened->round == 3);
  CHECK(reopened->reason == "node lost");

  auto ended = backend_event_from_frame(
      Json{{"event", "job_ended"}, {"state", "failed"}, {"reason", "rank 1: exit code 2"}});
  REQUIRE(ended);
  CHECK(ended->kind == BackendEvent::Kind::kJobEnded);
  CHECK(ended->state == "failed");
  CHECK(ended->reason == "rank 1: exit code 2");

  auto lost = backend_event_from_frame(Json{{"event", "connection_lost"}, {"reason", "eof"}});
  REQUIRE(lost);
  CHECK(lost->kind == BackendEvent::Kind::kConnectionLost);
  CHECK(lost->reason == "eof");

  auto attempt = backend_event_from_frame(
      Json{{"event", "connect_attempt_failed"}, {"reason", "connect to h:1: Connection refused"}});
  REQUIRE(attempt);
  CHECK(attempt->kind == BackendEvent::Kind::kConnectAttemptFailed);
  CHECK(attempt->reason == "connect to h:1: Connection refused");

  // A kind the agent does not act on is no event.
  CHECK_FALSE(backend_event_from_frame(Json{{"event", "something_new"}}).has_value());
}

TEST_CASE("backend events: a frame that cannot be read is a lost connection") {
  for (const Json& bad :
       {Json{{"round", 1}}, Json{{"event", 7}},
        Json{{"event", "round_reopened"}, {"round", "three"}}, Json{{"event", "job_ended"}},
        Json{{"event", "job_ended"}, {"reason", 5}}}) {
    INFO(bad.dump());
    auto e = backend_event_from_frame(bad);
    REQUIRE(e);
    CHECK(e->kind == BackendEvent::Kind::kConnectionLost);
    CHECK_FALSE(e->reason.empty());
  }
}
