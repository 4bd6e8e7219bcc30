#include "ctrun/worker/throughput.h"

namespace ctrun::worker {

void Throughput::record(std::uint64_t samples, std::chrono::nanoseconds elapsed) {
  steps_.push_back({samples, elapsed});
  window_samples_ += samples;
  window_elapsed_ += elapsed;
  total_samples_ += samples;
  while (steps_.size() > window_) {
    window_samples_ -= steps_.front().samples;
    window_elapsed_ -= steps_.front().elapsed;
    steps_.pop_front();
  }
}

double Throughput::samples_per_second() const {
  if (window_elapsed_.count() <= 0) return 0.0;
  return static_cast<double>(window_samples_) /
         std::chrono::duration<double>(window_elapsed_).count();
}

double Throughput::seconds_per_step() const {
  if (steps_.empty()) return 0.0;
  return std::chrono::duration<double>(window_elapsed_).count() /
         static_cast<double>(steps_.size());
}

}  // namespace ctrun::worker
