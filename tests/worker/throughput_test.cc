#include "ctrun/worker/throughput.h"

#include "catch.h"

using namespace std::chrono_literals;

TEST_CASE("throughput: samples per second over a sliding window") {
  ctrun::worker::Throughput t(2);
  CHECK(t.samples_per_second() == 0.0);
  t.record(100, 1s);
  CHECK(t.samples_per_second() == Approx(100.0));
  t.record(300, 1s);
  CHECK(t.samples_per_second() == Approx(200.0));
  t.record(500, 500ms);  // the first step leaves the window
  CHECK(t.samples_per_second() == Approx(800.0 / 1.5));
  CHECK(t.seconds_per_step() == Approx(0.75));
  CHECK(t.total_samples() == 900);
}
