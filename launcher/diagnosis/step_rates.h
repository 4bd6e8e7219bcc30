// How fast each worker of this node trains: the steps it reports (the number in its heartbeat
// file: ctrun_worker.report_step, the C++ runtime's report_step) with the agent's steady time of
// each reading, over the last `window` steps. A step that goes back (a restart from a
// checkpoint) starts the worker's history anew. No files, no timers: tested in memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <vector>

namespace ctrun::launcher {

class StepRates {
 public:
  using Clock = std::chrono::steady_clock;

  // A worker has a rate once it reported this many steps past its first reading (or the whole
  // window, if shorter).
  static constexpr int kMinSteps = 5;

  explicit StepRates(int window) : window_(window < 1 ? 1 : window) {}

  // A new group of `workers` workers; none has reported yet.
  void reset(int workers);
  // A new worker in `local_rank`'s place (--fault_tolerance=step): its history starts anew.
  void restart(int local_rank);
  // What the agent read for `local_rank` at `now`; the same step again changes nothing.
  void observe(int local_rank, std::int64_t step, Clock::time_point now);

  struct Rate {
    int local_rank = 0;
    std::int64_t step = 0;        // the last reported
    double seconds_per_step = 0;  // over `steps` steps (and the step under way, if longer)
    std::int64_t steps = 0;       // how many steps the rate spans
  };
  // The workers with a rate. A step still under way that has taken longer than the window's
  // average counts as one more step of the window, as long as it has taken so far: a worker
  // stuck in a slow step is slow before it ends it.
  std::vector<Rate> rates(Clock::time_point now) const;

 private:
  struct Point {
    std::int64_t step;
    Clock::time_point at;
  };
  int window_;
  std::vector<std::deque<Point>> workers_;
};

}  // namespace ctrun::launcher
