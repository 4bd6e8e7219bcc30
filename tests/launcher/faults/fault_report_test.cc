#include "launcher/faults/fault_report.h"

#include "catch.h"

using namespace ctrun::launcher;
using namespace std::chrono_literals;

namespace {
const FaultReport::Clock::time_point t0 = FaultReport::Clock::time_point{} + 1700000000s;
}

TEST_CASE("fault report: a killed worker's exit, the restart and the first step after it") {
  FaultReport report;
  report.fired(1, "fault 1: SIGKILL to rank 5 at step 40", 5, 1, true, 42, t0);
  report.step_reported(1, 43, t0 + 5ms);  // the dying process's last word: not after recovery
  report.worker_failed(1, t0 + 14ms);
  report.workers_started(std::nullopt, t0 + 36ms);
  report.restarts(1);
  report.step_reported(0, 33, t0 + 400ms);  // another worker
  report.step_reported(1, 33, t0 + 499ms);  // resumed from the checkpoint at step 32
  report.step_reported(1, 34, t0 + 510ms);
  const auto j = report.json("succeeded");
  CHECK(j["outcome"] == "succeeded");
  CHECK(j["restarts"] == 1);
  REQUIRE(j["faults"].size() == 1);
  const auto& f = j["faults"][0];
  CHECK(f["worker_exit_ms"] == 14);
  CHECK(f["running_again_ms"] == 36);
  CHECK(f["first_step"] == 33);
  CHECK(f["first_step_ms"] == 499);
  CHECK(f["steps_redone"] == 10);
  CHECK(f["fired"] == "2023-11-14T22:13:20.000Z");
  CHECK(report.lines() ==
        std::vector<std::string>{"fault 1 (rank 5): worker exit after 14 ms, running again after "
                                 "36 ms, step 33 after 499 ms (10 steps redone)"});
}

TEST_CASE("fault report: a hang that is resumed counts the first step after it") {
  FaultReport report;
  report.fired(2, "fault 2: rank 0 hung", 0, 0, false, 70, t0);
  report.step_reported(0, 70, t0 + 10ms);
  report.step_reported(0, 71, t0 + 1031ms);
  report.workers_started(std::nullopt, t0 + 2s);  // nothing died: nothing ran "again"
  const auto j = report.json("failed");
  const auto& f = j["faults"][0];
  CHECK(f["first_step"] == 71);
  CHECK(f["first_step_ms"] == 1031);
  CHECK_FALSE(f.contains("worker_exit"));
  CHECK_FALSE(f.contains("running_again"));
  CHECK_FALSE(f.contains("steps_redone"));
  // Over: a later failure of that worker is not this fault's doing.
  report.worker_failed(0, t0 + 3s);
  CHECK_FALSE(report.json("failed")["faults"][0].contains("worker_exit"));
  // A worker replaced alone runs again on its own.
  FaultReport ft;
  ft.fired(1, "kill", 3, 1, true, std::nullopt, t0);
  ft.worker_failed(1, t0 + 5ms);
  ft.workers_started(0, t0 + 6ms);  // another local rank
  ft.workers_started(1, t0 + 50ms);
  CHECK(ft.json("succeeded")["faults"][0]["running_again_ms"] == 50);
  CHECK(ft.lines() == std::vector<std::string>{"fault 1 (rank 3): worker exit after 5 ms, "
                                               "running again after 50 ms, no step reported "
                                               "after it"});
}

TEST_CASE("fault report: the node's progress, whichever worker steps past where it was") {
  // Restart mode: every worker resumes from a checkpoint below the fault; the node is past
  // its furthest step once a new process reports beyond it.
  FaultReport restart;
  restart.step_reported(0, 41, t0 - 30ms);
  restart.step_reported(1, 42, t0 - 20ms);
  restart.fired(1, "kill", 1, 1, true, 42, t0);
  restart.step_reported(0, 43, t0 + 5ms);  // before the restart stopped it: done again
  restart.worker_failed(1, t0 + 10ms);
  restart.workers_started(std::nullopt, t0 + 30ms);
  restart.step_reported(0, 41, t0 + 500ms);
  restart.step_reported(0, 42, t0 + 550ms);
  restart.step_reported(1, 43, t0 + 600ms);
  auto f = restart.json("succeeded")["faults"][0];
  CHECK(f["node_step_at_fault"] == 42);
  CHECK(f["progress_ms"] == 600);
  CHECK(restart.lines()[0].find("; the node past step 42 after 600 ms") != std::string::npos);
  // Per-step fault tolerance: a survivor goes on at once.
  FaultReport ft;
  ft.step_reported(0, 42, t0 - 20ms);
  ft.step_reported(1, 42, t0 - 20ms);
  ft.fired(1, "kill", 1, 1, true, 42, t0);
  ft.step_reported(0, 43, t0 + 65ms);
  CHECK(ft.json("succeeded")["faults"][0]["progress_ms"] == 65);
}

TEST_CASE("fault report: a peer that failed first, and the group's restart, are the fault's") {
  FaultReport report;
  report.fired(1, "exception", 2, 2, true, 46, t0);
  report.worker_failed(0, t0 + 30ms);  // its collective broke before the target had exited
  report.workers_started(std::nullopt, t0 + 60ms);  // the target was stopped with the group
  const auto f = report.json("succeeded")["faults"][0];
  CHECK(f["worker_exit_ms"] == 30);
  CHECK(f["running_again_ms"] == 60);
}

TEST_CASE("fault report: a fault of the whole node is seen in any of its workers") {
  FaultReport report;
  report.step_reported(0, 10, t0);
  report.step_reported(1, 10, t0);
  report.fired(1, "cut off", -1, -1, false, std::nullopt, t0 + 5ms);
  report.worker_failed(1, t0 + 40ms);
  report.workers_started(std::nullopt, t0 + 90ms);
  report.step_reported(0, 8, t0 + 120ms);  // resumed from a checkpoint
  report.step_reported(0, 11, t0 + 300ms);
  const auto f = report.json("succeeded")["faults"][0];
  CHECK(f["worker_exit_ms"] == 35);
  CHECK(f["running_again_ms"] == 85);
  CHECK(f["first_step"] == 8);
  CHECK(f["progress_ms"] == 295);
}

TEST_CASE("fault report: a node's fault whose effect is its workers stopped by the agent") {
  FaultReport report;
  report.fired(1, "cut off", -1, -1, false, std::nullopt, t0);
  report.workers_stopped(t0 + 3s);  // it rejoined: a new round
  report.workers_started(std::nullopt, t0 + 3100ms);
  const auto f = report.json("succeeded")["faults"][0];
  CHECK(f["worker_exit_ms"] == 3000);
  CHECK(f["running_again_ms"] == 3100);
}

TEST_CASE("fault report: a node's fault felt later, after the node went on, counts from then") {
  FaultReport report;
  report.step_reported(0, 46, t0);
  report.fired(1, "cut off", -1, -1, false, std::nullopt, t0);
  report.step_reported(0, 47, t0 + 20ms);  // it trains on while cut off
  report.workers_stopped(t0 + 1000ms);     // reconnected, found itself dropped: a new round
  report.workers_started(std::nullopt, t0 + 1030ms);
  report.step_reported(0, 41, t0 + 1800ms);  // resumed from its checkpoint
  report.step_reported(0, 47, t0 + 2400ms);
  const auto f = report.json("succeeded")["faults"][0];
  CHECK(f["step_at_fault"] == 46);
  CHECK(f["worker_exit_ms"] == 1000);
  CHECK(f["running_again_ms"] == 1030);
  CHECK(f["first_step"] == 41);
  CHECK(f["first_step_ms"] == 1800);
  CHECK(f["steps_redone"] == 6);
  CHECK(f["progress_ms"] == 2400);
}
