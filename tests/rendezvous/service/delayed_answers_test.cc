// DelayedAnswers: what an injected store latency holds back, on a fake transport and a time the
// test moves.
#include "rendezvous/service/delayed_answers.h"

#include <chrono>
#include <string>

#include "catch.h"
#include "fake_transport.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;
using namespace std::chrono_literals;

namespace {

struct Answers {
  FakeTransport transport;
  DelayedAnswers answers{transport};
  TimePoint now = TimePoint() + 1000s;
  int delay_asked = 0;

  Answers() { transport.raw = {1, 2}; }
  void send(ConnectionId id, const std::string& bytes, Duration delay) {
    answers.send(id, bytes, now, [this, delay] {
      ++delay_asked;
      return delay;
    });
  }
  std::string sent(ConnectionId id) { return transport.take_raw(id); }
};

}  // namespace

TEST_CASE("delayed answers: with no job slowed, bytes go at once without asking the delay",
          "[unit][service]") {
  Answers a;
  a.send(1, "one", 0ms);
  CHECK(a.sent(1) == "one");
  CHECK(a.delay_asked == 0);
  CHECK(a.answers.held() == 0);
}

TEST_CASE("delayed answers: a slowed connection's bytes leave when due, in order",
          "[unit][service]") {
  Answers a;
  a.answers.slowed_until(a.now + 10s);
  a.send(1, "a", 200ms);
  a.send(2, "x", 0ms);  // its job is not slowed: at once
  CHECK(a.sent(2) == "x");
  a.now += 100ms;
  a.send(1, "b", 50ms);  // due sooner than "a", but never ahead of it
  a.answers.send_due(a.now);
  CHECK(a.sent(1).empty());
  a.now += 100ms;
  a.answers.send_due(a.now);
  CHECK(a.sent(1) == "ab");
  CHECK(a.answers.held() == 0);
  // Past the latency's end: the usual path again.
  a.now += 10s;
  a.delay_asked = 0;
  a.send(1, "c", 200ms);
  CHECK(a.sent(1) == "c");
  CHECK(a.delay_asked == 0);
}

TEST_CASE("delayed answers: a closing connection gets its held bytes at once, a gone one none",
          "[unit][service]") {
  Answers a;
  a.answers.slowed_until(a.now + 10s);
  a.send(1, "held", 5s);
  a.send(2, "lost", 5s);
  a.answers.send_all(1);
  CHECK(a.sent(1) == "held");
  a.answers.forget(2);
  CHECK(a.answers.held() == 0);
  a.now += 6s;
  a.answers.send_due(a.now);
  CHECK(a.sent(2).empty());
}
