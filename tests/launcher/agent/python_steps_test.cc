// Steps without a code change: a Python script that knows nothing of ctrun (it steps torch
// optimizers, tests/python/optimizer_steps.py) gets ctrun's step-timed faults and its
// --worker_timeout, because ctrun's sitecustomize counts its first optimizer's steps.
#include <chrono>
#include <fstream>

#include "catch.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

void make_empty(const std::string& path) { std::ofstream(path, std::ios::trunc); }

}  // namespace

TEST_CASE(
    "steps: the first optimizer's steps are a script's, report_step wins, accumulation counts "
    "once") {
  ScratchDir s("steps_check");
  make_empty(s.path("heartbeat"));
  // Run as the agent runs a worker: ctrun's helper directory first on the path, a heartbeat file.
  ChildProcess check({"/usr/bin/env", "PYTHONPATH=" CTRUN_PYTHON_HELPER_DIR,
                      "CTRUN_HEARTBEAT_FILE=" + s.path("heartbeat"), "/usr/bin/python3",
                      OPTIMIZER_STEPS_SCRIPT_PATH, "check"},
                     s.path("check.log"));
  const auto rc = check.wait(60s);
  INFO(read_file(s.path("check.log")));
  CHECK(rc == std::optional<int>(0));
  // Turned off, the file is not written: the script's first check fails, and stops there.
  make_empty(s.path("heartbeat"));
  ChildProcess off({"/usr/bin/env", "PYTHONPATH=" CTRUN_PYTHON_HELPER_DIR, "CTRUN_AUTO_STEPS=0",
                    "CTRUN_HEARTBEAT_FILE=" + s.path("heartbeat"), "/usr/bin/python3",
                    OPTIMIZER_STEPS_SCRIPT_PATH, "check"},
                   s.path("off.log"));
  CHECK(off.wait(60s) == std::optional<int>(1));
  CHECK(read_file(s.path("heartbeat")).empty());
}

TEST_CASE(
    "steps: an exception planned at a step is raised in an unmodified script's optimizer step") {
  ScratchDir s("steps_fault");
  SystemPython python;
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=1", "--max_restarts=1", "--faults",
       "exception:rank=0,at_step=10", OPTIMIZER_STEPS_SCRIPT_PATH, "train", "30"},
      s.path("agent.log"));
  const auto rc = agent.wait(90s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc == std::optional<int>(0));
  CHECK(log.find("injecting fault 1: an exception raised in rank 0 at step 10") !=
        std::string::npos);
  // Raised from the script's own optimizer.step() call.
  CHECK(log.find("optimizer.step()") != std::string::npos);
  CHECK(log.find("ctrun_worker.InjectedFault: ctrun: injected fault 1") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  CHECK(log.find("trained 30 steps") != std::string::npos);
}

TEST_CASE("steps: --worker_timeout kills an unmodified script that stops stepping") {
  ScratchDir s("steps_timeout");
  SystemPython python;
  // 5 steps of 50 ms, then it hangs: silent for 2 s after beats, it is killed as hung.
  ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=1", "--worker_timeout=2",
                      OPTIMIZER_STEPS_SCRIPT_PATH, "train", "1000", "5"},
                     s.path("agent.log"));
  REQUIRE(agent.wait(90s) == std::optional<int>(1));
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(log.find("(local rank 0): no heartbeat for ") != std::string::npos);
  CHECK(log.find("killed as hung") != std::string::npos);
}
