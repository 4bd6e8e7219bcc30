// The loop by which a fault-tolerant replica settles on a quorum, on a fake quorum and a manual
// clock: every answer beats the heartbeat (the fix of 0dbdd1b: a survivor waiting out a hung
// peer's removal was taken for hung by ctrun --worker_timeout), sitting out never times out,
// failing to adopt does.
#include "worker_runtime/quorum/quorum_settle.h"

#include <deque>

#include "catch.h"

using ctrun::rendezvous::Error;
using ctrun::rendezvous::ErrorCode;
using ctrun::rendezvous::ManualClock;
using ctrun::rendezvous::QuorumAssignment;
using ctrun::rendezvous::Result;
using ctrun::worker::QuorumSettleHooks;
using ctrun::worker::settle_quorum;
using namespace std::chrono_literals;

namespace {

// A replica's side of the loop: answers and adopt outcomes in order, what it was asked to do.
struct FakeReplica {
  ManualClock clock;
  std::deque<Result<QuorumAssignment>> answers;
  // Per adopt() call: why it failed ("" adopted), and whether it sat the quorum out.
  std::deque<std::pair<std::string, bool>> adopts;
  std::chrono::milliseconds each_ask_takes = 1s;
  bool sitting_out = false;
  int asks = 0;
  int beats = 0;
  std::vector<std::string> logs;

  QuorumSettleHooks hooks() {
    QuorumSettleHooks h;
    h.ask = [this]() -> Result<QuorumAssignment> {
      ++asks;
      clock.advance(each_ask_takes);
      REQUIRE_FALSE(answers.empty());
      auto next = answers.front();
      answers.pop_front();
      return next;
    };
    h.adopt = [this](const QuorumAssignment&) {
      REQUIRE_FALSE(adopts.empty());
      auto [why, sit_out] = adopts.front();
      adopts.pop_front();
      sitting_out = sit_out;
      return why;
    };
    h.sitting_out = [this] { return sitting_out; };
    h.heartbeat = [this] { ++beats; };
    h.log = [this](const std::string& line) { logs.push_back(line); };
    return h;
  }
};

QuorumAssignment quorum(std::int64_t id) {
  QuorumAssignment a;
  a.quorum_id = id;
  a.max_step = 10;
  return a;
}

}  // namespace

TEST_CASE("quorum settle: each answer beats the heartbeat while adopting fails and is retried") {
  FakeReplica r;
  // A survivor whose communicator broke with a hung peer: two quorums still hold the peer (the
  // communicator cannot be built), the third is without it.
  r.answers = {quorum(1), quorum(2), quorum(3)};
  r.adopts = {{"gloo: connect timed out", false}, {"gloo: connect timed out", false}, {"", false}};
  auto settled = settle_quorum(r.hooks(), 30s, r.clock);
  REQUIRE(settled.ok());
  CHECK_FALSE(settled.value().has_value());
  CHECK(r.asks == 3);
  CHECK(r.beats == 3);  // without a beat per answer ctrun --worker_timeout took it for hung
  CHECK(r.logs == std::vector<std::string>{"quorum 1: gloo: connect timed out; asking again",
                                           "quorum 2: gloo: connect timed out; asking again"});
}

TEST_CASE("quorum settle: a replica sitting out waits past the quorum timeout, beating") {
  FakeReplica r;
  r.each_ask_takes = 20s;  // 5 answers, 100 s, against a 30 s quorum timeout
  for (int i = 1; i <= 5; ++i) r.answers.push_back(quorum(i));
  for (int i = 0; i < 4; ++i) r.adopts.push_back({"", true});
  r.adopts.push_back({"", false});
  auto settled = settle_quorum(r.hooks(), 30s, r.clock);
  REQUIRE(settled.ok());
  CHECK_FALSE(settled.value().has_value());
  CHECK(r.asks == 5);
  CHECK(r.beats == 5);
}

TEST_CASE("quorum settle: adopting that keeps failing past the quorum timeout is an error") {
  FakeReplica r;
  r.each_ask_takes = 10s;
  for (int i = 1; i <= 10; ++i) {
    r.answers.push_back(quorum(i));
    r.adopts.push_back({"nccl: unhandled system error", false});
  }
  auto settled = settle_quorum(r.hooks(), 30s, r.clock);
  REQUIRE_FALSE(settled.ok());
  CHECK(settled.error().code == ErrorCode::kTimeout);
  CHECK(settled.error().message ==
        "no working communicator within the quorum timeout (30000 ms): nccl: unhandled system "
        "error");
  // Asked at 10, 20 and 30 s: the third failure is at the deadline.
  CHECK(r.asks == 3);
  CHECK(r.beats == 3);
}

TEST_CASE("quorum settle: a finished training ends it with its last step, no quorum is an error") {
  FakeReplica r;
  auto done = quorum(4);
  done.finished = true;
  done.max_step = 120;
  r.answers = {done};
  auto settled = settle_quorum(r.hooks(), 30s, r.clock);
  REQUIRE(settled.ok());
  REQUIRE(settled.value().has_value());
  CHECK(*settled.value() == 120);
  CHECK(r.beats == 1);

  FakeReplica lonely;
  lonely.answers = {Error{ErrorCode::kTimeout, "no quorum formed"}};
  settled = settle_quorum(lonely.hooks(), 30s, lonely.clock);
  REQUIRE_FALSE(settled.ok());
  CHECK(settled.error().message == "no quorum formed");
  CHECK(lonely.beats == 0);  // no answer, no proof of life
}
