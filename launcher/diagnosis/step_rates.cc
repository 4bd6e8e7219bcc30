#include "launcher/diagnosis/step_rates.h"

#include <algorithm>

namespace ctrun::launcher {

void StepRates::reset(int workers) {
  workers_.assign(static_cast<std::size_t>(std::max(workers, 0)), {});
}

void StepRates::restart(int local_rank) {
  if (local_rank >= 0 && static_cast<std::size_t>(local_rank) < workers_.size()) {
    workers_[static_cast<std::size_t>(local_rank)].clear();
  }
}

void StepRates::observe(int local_rank, std::int64_t step, Clock::time_point now) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  auto& points = workers_[static_cast<std::size_t>(local_rank)];
  if (!points.empty() && step == points.back().step) return;
  if (!points.empty() && step < points.back().step) points.clear();  // resumed from earlier
  points.push_back({step, now});
  // Kept: the last `window` steps, and the point they are measured from.
  while (points.size() > 2 && points[1].step <= step - window_) points.pop_front();
}

std::vector<StepRates::Rate> StepRates::rates(Clock::time_point now) const {
  std::vector<Rate> out;
  const std::int64_t needed = std::min<std::int64_t>(kMinSteps, window_);
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    const auto& points = workers_[i];
    if (points.size() < 2) continue;
    const Point& first = points.front();
    const Point& last = points.back();
    const std::int64_t steps = last.step - first.step;
    if (steps < needed) continue;
    const double span = std::chrono::duration<double>(last.at - first.at).count();
    const double average = span / static_cast<double>(steps);
    // The step under way, once longer than the average, counts as one more step of the window:
    // a stuck rank grows slow at once, a single hiccup barely moves it.
    const double under_way = std::chrono::duration<double>(now - last.at).count();
    const double per_step =
        under_way > average ? (span + under_way) / static_cast<double>(steps + 1) : average;
    out.push_back(Rate{static_cast<int>(i), last.step, per_step, steps});
  }
  return out;
}

}  // namespace ctrun::launcher
