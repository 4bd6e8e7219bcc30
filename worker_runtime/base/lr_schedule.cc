#include "ctrun/worker/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ctrun::worker {

double scale_lr_linearly(double base_lr, int world_size) {
  return base_lr * std::max(world_size, 1);
}

double WarmupCosineSchedule::lr_at(std::int64_t step) const {
  step = std::max<std::int64_t>(step, 0);
  if (step < warmup_steps) {
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const std::int64_t decay_steps = total_steps - warmup_steps;
  if (total_steps <= 0 || decay_steps <= 0) return peak_lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace ctrun::worker
