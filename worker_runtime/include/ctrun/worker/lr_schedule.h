// Learning-rate schedules LibTorch 1.13's C++ API lacks: linear warmup then cosine decay, and
// the linear scaling rule (lr grows with the number of workers, as the global batch does).
#pragma once

#include <cstdint>

namespace ctrun::worker {

// The linear scaling rule: a base rate tuned for one worker, scaled to `world_size` workers.
double scale_lr_linearly(double base_lr, int world_size);

struct WarmupCosineSchedule {
  double peak_lr = 1e-3;
  std::int64_t warmup_steps = 0;  // lr rises linearly from peak/warmup to peak over these steps
  std::int64_t total_steps = 0;   // cosine reaches min_lr here; 0: constant after warmup
  double min_lr = 0.0;

  // The rate for optimizer step `step` (0-based). Past total_steps it stays at min_lr.
  double lr_at(std::int64_t step) const;
};

}  // namespace ctrun::worker
