#include "launcher/diagnosis/heartbeat_monitor.h"

namespace ctrun::launcher {

void HeartbeatMonitor::reset(const std::vector<std::int64_t>& initial_stamps,
                             Clock::time_point now) {
  workers_.assign(initial_stamps.size(), Worker{});
  for (std::size_t i = 0; i < initial_stamps.size(); ++i) {
    workers_[i].stamp = initial_stamps[i];
    workers_[i].changed = now;
  }
}

void HeartbeatMonitor::replace(int local_rank, std::int64_t initial_stamp, Clock::time_point now) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  Worker& w = workers_[static_cast<std::size_t>(local_rank)];
  w = Worker{};
  w.stamp = initial_stamp;
  w.changed = now;
}

void HeartbeatMonitor::observe(int local_rank, std::int64_t stamp, Clock::time_point now) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  Worker& w = workers_[static_cast<std::size_t>(local_rank)];
  if (stamp == w.stamp) return;
  w.stamp = stamp;
  w.changed = now;
  w.beating = true;
}

std::vector<int> HeartbeatMonitor::take_overdue(Clock::time_point now) {
  std::vector<int> overdue;
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (!w.beating || w.named || now - w.changed <= timeout_) continue;
    w.named = true;
    overdue.push_back(static_cast<int>(i));
  }
  return overdue;
}

std::chrono::milliseconds HeartbeatMonitor::silent_for(int local_rank,
                                                       Clock::time_point now) const {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= workers_.size()) return {};
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      now - workers_[static_cast<std::size_t>(local_rank)].changed);
}

}  // namespace ctrun::launcher
