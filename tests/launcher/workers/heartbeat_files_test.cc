// HeartbeatFiles: the one reader of the workers' heartbeat files, on real files in a scratch
// directory.
#include "launcher/workers/heartbeat_files.h"

#include <fstream>
#include <string>
#include <thread>

#include "catch.h"
#include "process.h"

using namespace ctrun::launcher;
using namespace ctrun::testing;

namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("heartbeat files: the step is the number a worker wrote first, else none",
          "[unit][workers]") {
  ScratchDir dir("heartbeat_files");
  HeartbeatFiles files;
  files.reset(3);
  CHECK(files.size() == 3);
  REQUIRE(files.create(0, dir.path("hb0")));
  REQUIRE(files.create(1, dir.path("hb1")));
  CHECK_FALSE(files.step(0).has_value());  // made empty: never written
  write(dir.path("hb0"), "41 0.5\n");
  CHECK(files.step(0) == 41);
  write(dir.path("hb1"), "not a step");
  CHECK_FALSE(files.step(1).has_value());
  write(dir.path("hb1"), "-1");
  CHECK(files.step(1) == -1);
  CHECK_FALSE(files.step(2).has_value());  // no file for local rank 2
  CHECK_FALSE(files.step(7).has_value());  // no such local rank
  CHECK_FALSE(files.step(-1).has_value());
  write(dir.path("hb0"), "12");
  CHECK(files.step(0) == 12);
}

TEST_CASE("heartbeat files: a stamp changes with each write, and create empties the file",
          "[unit][workers]") {
  ScratchDir dir("heartbeat_stamps");
  HeartbeatFiles files;
  files.reset(2);
  REQUIRE(files.create(1, dir.path("hb1")));
  CHECK(files.stamp(0) == 0);  // no file
  const std::int64_t made = files.stamp(1);
  CHECK(made != 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past a coarse clock's tick
  write(dir.path("hb1"), "5");
  CHECK(files.stamp(1) != made);
  CHECK(files.stamps() == std::vector<std::int64_t>{0, files.stamp(1)});
  // A replaced worker's file starts empty again.
  REQUIRE(files.create(1, dir.path("hb1")));
  CHECK_FALSE(files.step(1).has_value());
  CHECK(modification_stamp(dir.path("missing")) == 0);
  CHECK_FALSE(files.create(0, dir.path("no/such/dir/hb0")));
}

TEST_CASE("heartbeat files: the time waited in collectives follows the step where measured",
          "[unit][workers]") {
  auto p = parse_progress("12 3400000\n");
  REQUIRE(p);
  CHECK(p->step == 12);
  CHECK(p->waited_ns == 3400000);
  p = parse_progress("12 3400000                          \n");  // padded to its width
  REQUIRE(p);
  CHECK(p->waited_ns == 3400000);
  p = parse_progress("12                                       \n");  // a step alone, padded
  REQUIRE(p);
  CHECK(p->step == 12);
  CHECK_FALSE(p->waited_ns);
  p = parse_progress("12\n");
  REQUIRE(p);
  CHECK_FALSE(p->waited_ns);
  // Not a count of nanoseconds: the step alone.
  CHECK_FALSE(parse_progress("41 0.5\n")->waited_ns);
  CHECK_FALSE(parse_progress("41 -5\n")->waited_ns);
  CHECK_FALSE(parse_progress("41 x")->waited_ns);
  CHECK_FALSE(parse_progress("").has_value());

  ScratchDir dir("heartbeat_progress");
  HeartbeatFiles files;
  files.reset(1);
  REQUIRE(files.create(0, dir.path("hb0")));
  write(dir.path("hb0"), "7 250000000\n");
  auto read = files.progress(0);
  REQUIRE(read);
  CHECK(read->step == 7);
  CHECK(read->waited_ns == 250000000);
  CHECK(files.step(0) == 7);
}
