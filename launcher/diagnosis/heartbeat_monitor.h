// Which workers stopped making progress (--worker_timeout). The agent reads each worker's
// heartbeat file and feeds its modification time here as an opaque stamp, with the time of the
// reading on its steady clock; a stamp that changes is a beat. Judging change against the
// agent's own clock, not the file's time, makes a wall-clock jump harmless. No files, no timers:
// tested in memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace ctrun::launcher {

class HeartbeatMonitor {
 public:
  using Clock = std::chrono::steady_clock;

  explicit HeartbeatMonitor(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // A new group of workers; `initial_stamps[i]` is local rank i's file before its first beat.
  void reset(const std::vector<std::int64_t>& initial_stamps, Clock::time_point now);
  // A new worker in `local_rank`'s place, the others going on (--fault_tolerance=step).
  void replace(int local_rank, std::int64_t initial_stamp, Clock::time_point now);
  // What the agent just read for `local_rank`.
  void observe(int local_rank, std::int64_t stamp, Clock::time_point now);
  // Workers that beat at least once and not for longer than the timeout since; each is named
  // once per group. A worker that never beat (a program without the runtime) is never overdue.
  std::vector<int> take_overdue(Clock::time_point now);
  // How long the overdue worker had been silent when it was named, for the report.
  std::chrono::milliseconds silent_for(int local_rank, Clock::time_point now) const;

 private:
  struct Worker {
    std::int64_t stamp = 0;
    Clock::time_point changed{};
    bool beating = false;
    bool named = false;
  };
  std::chrono::milliseconds timeout_;
  std::vector<Worker> workers_;
};

}  // namespace ctrun::launcher
