#include "launcher/diagnosis/health_checks.h"

#include "catch.h"

using namespace ctrun::launcher;

TEST_CASE("health checks: free space below the minimum, or unreadable, is a problem") {
  const std::uint64_t mib = 1ULL << 20;
  CHECK_FALSE(free_space_problem("/logs", 500 * mib, 100 * mib));
  CHECK_FALSE(free_space_problem("/logs", 5 * mib, 0));  // 0: not checked
  auto low = free_space_problem("/logs", 12 * mib + 5, 100 * mib);
  REQUIRE(low);
  CHECK(low->check == "free space");
  CHECK(low->detail == "/logs has 12 MiB free, below 100 MiB (--health_min_free_mib)");
  auto gone = free_space_problem("/gone", std::nullopt, 100 * mib);
  REQUIRE(gone);
  CHECK(gone->detail == "/gone cannot be read");
}

TEST_CASE("health checks: a GPU that cannot be read or reports a fault is a problem") {
  GpuReading ok{0, "NVIDIA H100", "", false, false, false, {}};
  CHECK(gpu_problems({ok}).empty());
  GpuReading unread{1, "", "GPU is lost", false, false, false, {}};
  GpuReading faulty{2, "NVIDIA H100", "", true, true, false, {}};
  GpuReading remap{3, "NVIDIA H100", "", false, false, true, {}};
  const auto problems = gpu_problems({ok, unread, faulty, remap});
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].detail == "GPU 1 cannot be read: GPU is lost");
  CHECK(problems[1].detail ==
        "GPU 2 (NVIDIA H100) reports uncorrected ECC errors and retired pages pending a reset");
  CHECK(problems[2].detail == "GPU 3 (NVIDIA H100) reports a failed row remapping");
  CHECK(describe_problems(problems).find("gpu: GPU 1 cannot be read: GPU is lost; gpu: GPU 2") ==
        0);
}

TEST_CASE("health checks: the user's command fails, times out or cannot run, in its words") {
  CHECK_FALSE(command_problem("check.sh", true, true, false, "all good\n"));
  auto failed = command_problem("check.sh", true, false, false, "checking\nno GPU 3\n\n");
  REQUIRE(failed);
  CHECK(failed->check == "health check command");
  CHECK(failed->detail == "'check.sh' failed: no GPU 3");
  CHECK(command_problem("check.sh", true, false, true, "")->detail ==
        "'check.sh' did not finish in time (--health_check_timeout)");
  CHECK(command_problem("check.sh", false, false, false, "fork failed")->detail ==
        "'check.sh' could not run: fork failed");
}

TEST_CASE("health checks: the stopped workers still listed on a GPU hold its memory") {
  GpuReading a{0, "", "", false, false, false, {100, 200}};
  GpuReading b{1, "", "", false, false, false, {200, 300}};
  CHECK(gpu_memory_held({a, b}, {200, 300, 400}) == std::vector<unsigned>{200, 300});
  CHECK(gpu_memory_held({a, b}, {7}).empty());
  CHECK(gpu_memory_held({}, {200}).empty());
}
