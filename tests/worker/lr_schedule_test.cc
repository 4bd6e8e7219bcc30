#include "ctrun/worker/lr_schedule.h"

#include "catch.h"

using ctrun::worker::scale_lr_linearly;
using ctrun::worker::WarmupCosineSchedule;

TEST_CASE("lr: linear scaling with the world size") {
  CHECK(scale_lr_linearly(1e-3, 8) == Approx(8e-3));
  CHECK(scale_lr_linearly(1e-3, 1) == Approx(1e-3));
}

TEST_CASE("lr: warmup rises linearly to the peak, cosine decays to the minimum") {
  WarmupCosineSchedule s{1.0, 10, 110, 0.1};
  CHECK(s.lr_at(0) == Approx(0.1));
  CHECK(s.lr_at(4) == Approx(0.5));
  CHECK(s.lr_at(9) == Approx(1.0));
  CHECK(s.lr_at(10) == Approx(1.0));              // decay starts at the peak
  CHECK(s.lr_at(60) == Approx(0.1 + 0.5 * 0.9));  // half way: the mean of peak and min
  CHECK(s.lr_at(110) == Approx(0.1));
  CHECK(s.lr_at(500) == Approx(0.1));  // stays at the minimum
  for (std::int64_t step = 10; step < 110; ++step) CHECK(s.lr_at(step + 1) <= s.lr_at(step));
}

TEST_CASE("lr: without total steps the rate stays at the peak after warmup") {
  WarmupCosineSchedule s{0.5, 0, 0, 0.0};
  CHECK(s.lr_at(0) == Approx(0.5));
  CHECK(s.lr_at(1000000) == Approx(0.5));
}
