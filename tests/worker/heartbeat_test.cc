#include "ctrun/worker/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "process.h"

using ctrun::worker::HeartbeatFile;
using namespace std::chrono_literals;

namespace {

// Sets the file's modification time far in the past, so that a beat is plain to see.
void age(const std::string& path) {
  const timespec old[2] = {{1000, 0}, {1000, 0}};
  REQUIRE(utimensat(AT_FDCWD, path.c_str(), old, 0) == 0);
}

std::int64_t mtime_seconds(const std::string& path) {
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  return st.st_mtim.tv_sec;
}

}  // namespace

TEST_CASE("heartbeat: a beat moves the file's time, at most once per interval") {
  ctrun::testing::ScratchDir dir("heartbeat");
  const std::string path = dir.path("beat");
  std::ofstream(path).close();
  age(path);
  HeartbeatFile file(path, 100ms);
  const auto t0 = HeartbeatFile::Clock::time_point{} + 1h;
  CHECK(file.beat(t0));
  CHECK(mtime_seconds(path) > 1000);
  age(path);
  CHECK_FALSE(file.beat(t0 + 99ms));  // too soon: nothing written
  CHECK(mtime_seconds(path) == 1000);
  CHECK(file.beat(t0 + 100ms));
  CHECK(mtime_seconds(path) > 1000);
}

TEST_CASE("heartbeat: a missing file is not created") {
  ctrun::testing::ScratchDir dir("heartbeat");
  const std::string path = dir.path("gone");
  HeartbeatFile file(path);
  CHECK_FALSE(file.beat(HeartbeatFile::Clock::now()));
  CHECK_FALSE(std::filesystem::exists(path));
}
