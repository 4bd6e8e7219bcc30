#include "ctrun/worker/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "catch.h"
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

// One case for every form of the agent's fault file: the variable is read once per process.
TEST_CASE("heartbeat: report_step raises the planned exception, or makes the planned CUDA error") {
  ctrun::testing::ScratchDir dir("heartbeat_fault");
  const std::string path = dir.path("fault");
  ::setenv("CTRUN_FAULT_FILE", path.c_str(), 1);
  ::unsetenv("CTRUN_HEARTBEAT_FILE");
  auto raised = [](std::int64_t step) -> std::string {
    try {
      ctrun::worker::report_step(step);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  CHECK(raised(1).empty());  // no file: nothing planned
  std::ofstream(path) << "exception\nctrun: injected fault 1: an exception raised in rank 0\n";
  CHECK_THROWS_AS(ctrun::worker::report_step(2), ctrun::worker::InjectedFault);
  CHECK(raised(2) == "ctrun: injected fault 1: an exception raised in rank 0");
  std::ofstream(path) << "ctrun: injected fault 1: the message alone\n";  // an older agent's
  CHECK(raised(2) == "ctrun: injected fault 1: the message alone");
  std::ofstream(path, std::ios::trunc).close();  // an empty file: an exception all the same
  CHECK(raised(2) == "ctrun: injected exception");

  // A CUDA error without a maker (no NCCL group in this process): said, as an exception.
  std::ofstream(path) << "cuda_error\nctrun: injected fault 2: a CUDA error in rank 0\n";
  CHECK_THROWS_AS(ctrun::worker::report_step(3), ctrun::worker::InjectedFault);
  CHECK(raised(3) ==
        "ctrun: injected fault 2: a CUDA error in rank 0: no CUDA device in this worker (its "
        "process group is not libctrun_worker's NCCL one); raised as an exception instead");
  // With one: its error is what report_step throws.
  std::string asked;
  ctrun::worker::set_cuda_error_maker([&asked](const std::string& message) {
    asked = message;
    throw std::runtime_error("CUDA error: device-side assert triggered");
  });
  CHECK(raised(3) == "CUDA error: device-side assert triggered");
  CHECK(asked == "ctrun: injected fault 2: a CUDA error in rank 0");
  ctrun::worker::set_cuda_error_maker({});
  CHECK_THROWS_AS(ctrun::worker::report_step(3), ctrun::worker::InjectedFault);
  std::remove(path.c_str());
  CHECK(raised(4).empty());
  ::unsetenv("CTRUN_FAULT_FILE");
}
