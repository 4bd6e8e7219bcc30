// process_stats: a worker's CPU time, run delay and state, parsed from /proc's text, and read
// from this test's own process.
#include "launcher/workers/process_stats.h"

#include <unistd.h>

#include "catch.h"

using ctrun::launcher::parse_process_stats;
using ctrun::launcher::read_process_stats;

TEST_CASE("process stats: CPU time, run delay and a stopped state from /proc's text",
          "[unit][workers]") {
  // A command with spaces and parentheses: the fields count from the last ')'. utime 250 and
  // stime 50 ticks at 100 a second: 3 s.
  const std::string stat =
      "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 12 0 100 0";
  auto s = parse_process_stats(stat, "2900000000 123456789 77\n", 100);
  REQUIRE(s);
  CHECK(s->cpu_ns == 3'000'000'000LL);
  CHECK(s->run_delay_ns == 123456789);
  CHECK_FALSE(s->stopped);
  std::string stopped = stat;
  stopped.replace(stopped.find(") S ") + 2, 1, "T");
  CHECK(parse_process_stats(stopped, "", 100)->stopped);
  CHECK(parse_process_stats(stopped, "", 100)->run_delay_ns == 0);  // no schedstat: none
  stopped.replace(stopped.find(") T ") + 2, 1, "t");                // stopped by a tracer
  CHECK(parse_process_stats(stopped, "", 100)->stopped);
  // Not a process's stat: nothing, never a guess.
  CHECK_FALSE(parse_process_stats("", "", 100));
  CHECK_FALSE(parse_process_stats("4242 (x) S 1 2", "", 100));
  CHECK_FALSE(parse_process_stats("4242 (x) S 1 4242 4242 0 -1 0 0 0 0 0 ab 50", "", 100));

  // This process: running, with some CPU time; a PID that is none reads as nothing.
  auto self = read_process_stats(static_cast<int>(::getpid()));
  REQUIRE(self);
  CHECK_FALSE(self->stopped);
  CHECK(self->cpu_ns >= 0);
  CHECK_FALSE(read_process_stats(0));
}
