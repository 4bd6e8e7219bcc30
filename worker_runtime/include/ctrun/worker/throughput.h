// Step timing for trainers: samples per second over a window of steps, fed with durations the
// caller measured, so the arithmetic is tested without a clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>

namespace ctrun::worker {

class Throughput {
 public:
  explicit Throughput(std::size_t window_steps = 50) : window_(window_steps) {}

  void record(std::uint64_t samples, std::chrono::nanoseconds elapsed);

  // Over the last `window_steps` recorded steps; 0 before the first.
  double samples_per_second() const;
  // Mean step time over the same window, in seconds.
  double seconds_per_step() const;
  std::uint64_t total_samples() const { return total_samples_; }

 private:
  struct Step {
    std::uint64_t samples;
    std::chrono::nanoseconds elapsed;
  };
  std::size_t window_;
  std::deque<Step> steps_;
  std::uint64_t window_samples_ = 0;
  std::chrono::nanoseconds window_elapsed_{0};
  std::uint64_t total_samples_ = 0;
};

}  // namespace ctrun::worker
