#include "launcher/diagnosis/heartbeat_monitor.h"

#include "catch.h"

using ctrun::launcher::HeartbeatMonitor;
using namespace std::chrono_literals;

TEST_CASE("heartbeat monitor: a worker that stops beating is named once, after the timeout") {
  HeartbeatMonitor m(2000ms);
  const auto t0 = HeartbeatMonitor::Clock::time_point{} + 1h;
  m.reset({100, 100}, t0);
  m.observe(0, 101, t0 + 500ms);
  m.observe(1, 101, t0 + 500ms);
  // Rank 0 keeps beating, rank 1 goes quiet after its first beat.
  for (int i = 1; i <= 5; ++i) m.observe(0, 101 + i, t0 + 500ms + i * 500ms);
  CHECK(m.take_overdue(t0 + 2500ms).empty());  // exactly the timeout is not over it
  const auto overdue = m.take_overdue(t0 + 2501ms);
  CHECK(overdue == std::vector<int>{1});
  CHECK(m.silent_for(1, t0 + 2501ms) == 2001ms);
  CHECK(m.take_overdue(t0 + 10s) == std::vector<int>{0});  // rank 0 too, once it stops
  CHECK(m.take_overdue(t0 + 20s).empty());                 // each named once
}

TEST_CASE("heartbeat monitor: a worker that never beat is never overdue") {
  HeartbeatMonitor m(1000ms);
  const auto t0 = HeartbeatMonitor::Clock::time_point{} + 1h;
  m.reset({7}, t0);
  m.observe(0, 7, t0 + 5s);  // the file as the agent made it
  CHECK(m.take_overdue(t0 + 1h).empty());
}

TEST_CASE("heartbeat monitor: judged on the agent's clock, whatever the stamps say") {
  HeartbeatMonitor m(1000ms);
  const auto t0 = HeartbeatMonitor::Clock::time_point{} + 1h;
  m.reset({50}, t0);
  // A wall-clock jump backwards makes the stamp smaller: still a change, still a beat.
  m.observe(0, 10, t0 + 900ms);
  m.observe(0, 5, t0 + 1800ms);
  CHECK(m.take_overdue(t0 + 2700ms).empty());
  CHECK(m.take_overdue(t0 + 2900ms) == std::vector<int>{0});
}

TEST_CASE("heartbeat monitor: a new group starts clean, out-of-range ranks are ignored") {
  HeartbeatMonitor m(1000ms);
  const auto t0 = HeartbeatMonitor::Clock::time_point{} + 1h;
  m.reset({0}, t0);
  m.observe(0, 1, t0);
  CHECK(m.take_overdue(t0 + 2s) == std::vector<int>{0});
  m.reset({0, 0}, t0 + 3s);
  m.observe(5, 1, t0 + 3s);
  m.observe(-1, 1, t0 + 3s);
  CHECK(m.take_overdue(t0 + 10s).empty());
  CHECK(m.silent_for(9, t0) == 0ms);
}

TEST_CASE("heartbeat monitor: a replaced worker starts afresh, the others keep their history") {
  HeartbeatMonitor m(2000ms);
  const auto t0 = HeartbeatMonitor::Clock::time_point{} + 1h;
  m.reset({10, 20}, t0);
  m.observe(0, 11, t0 + 100ms);
  m.observe(1, 21, t0 + 100ms);
  // Rank 1 hangs and is named; its replacement has not beaten yet, so it is not overdue.
  CHECK(m.take_overdue(t0 + 2200ms) == std::vector<int>{0, 1});
  m.replace(1, 30, t0 + 2300ms);
  CHECK(m.take_overdue(t0 + 5000ms).empty());
  m.observe(1, 31, t0 + 5100ms);
  CHECK(m.take_overdue(t0 + 7200ms) == std::vector<int>{1});
}
