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
  // Wall-clock time in milliseconds since the Unix epoch: for deadlines that travel between
  // machines (the etcd backend's saved rendezvous), where steady times mean nothing.
  virtual std::int64_t unix_millis() const = 0;
};

class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  std::int64_t unix_millis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// A clock that moves only when told to; for unit tests.
class ManualClock final : public Clock {
 public:
  TimePoint now() const override { return now_; }
  std::int64_t unix_millis() const override {
    return kUnixStartMillis + to_millis(now_.time_since_epoch());
  }
  void advance(Duration d) { now_ += d; }
  static constexpr std::int64_t kUnixStartMillis = 1'790'000'000'000;  // late 2026

 private:
  TimePoint now_{std::chrono::hours(1)};
};

}  // namespace ctrun::rendezvous
