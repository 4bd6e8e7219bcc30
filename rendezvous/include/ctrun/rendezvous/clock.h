// The time seam: logic classes read time only through Clock, so tests drive it by hand.
#pragma once

#include <chrono>
#include <cstdint>

namespace ctrun::rendezvous {

using Duration = std::chrono::steady_clock::duration;
using TimePoint = std::chrono::steady_clock::time_point;

// Whole milliseconds, as durations travel on the wire and appear in messages.
inline std::int64_t to_millis(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
};

// A clock that moves only when told to; for unit tests.
class ManualClock final : public Clock {
 public:
  TimePoint now() const override { return now_; }
  void advance(Duration d) { now_ += d; }

 private:
  TimePoint now_{std::chrono::hours(1)};
};

}  // namespace ctrun::rendezvous
