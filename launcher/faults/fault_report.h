// What became of each fault an agent injected (`ctrun --fault_report=FILE`): when it fired,
// when the agent saw its effect (the worker's exit), when workers ran again, the first step
// reported after it and how many steps were done again. Pure: the agent feeds it what happens,
// with its times; it writes nothing itself (docs/faults.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

class FaultReport {
 public:
  using Clock = std::chrono::system_clock;

  // A fault fired on `local_rank` (global `rank`); `step`: the last step that worker reported,
  // if any. `ends_worker`: a signal or an exception, whose recovery is a new process (steps the
  // old one reported before its exit was seen do not count).
  void fired(int fault_id, const std::string& what, int rank, int local_rank, bool ends_worker,
             std::optional<std::int64_t> step, Clock::time_point at);
  // A worker of this node failed (a non-zero exit or a signal): a fault's effect seen.
  void worker_failed(int local_rank, Clock::time_point at);
  // The node's workers stopped by the agent (a new round, the job's end): the effect of the
  // latest fault of the whole node not yet seen (a cut-off that cost the node its place), even
  // after the node went on for a while; its steps are then counted from the restart.
  void workers_stopped(Clock::time_point at);
  // Workers run again: every one (`local_rank` empty: a restart of the group, a new round) or
  // one replaced alone.
  void workers_started(std::optional<int> local_rank, Clock::time_point at);
  // A worker of this node reported a step.
  void step_reported(int local_rank, std::int64_t step, Clock::time_point at);
  // The job's restarts so far, as the agent last knew them.
  void restarts(int count) { restarts_ = count; }

  // The report: {"faults": [...], "restarts": N, "outcome": ...}.
  rendezvous::Json json(const std::string& outcome) const;
  // One line per fault for the console ("fault 1: worker exit seen after 21 ms, ...").
  std::vector<std::string> lines() const;

 private:
  struct Entry {
    int fault_id = 0;
    std::string what;
    int rank = 0;
    int local_rank = 0;
    bool ends_worker = false;
    std::optional<std::int64_t> step_at_fault;
    Clock::time_point fired;
    std::optional<Clock::time_point> detected;  // the target's exit
    // A peer's failure seen first (the target's fault broke its collectives): the fault's
    // effect when the whole group then restarts before the target's own exit was seen.
    std::optional<Clock::time_point> peer_failed;
    std::optional<Clock::time_point> running_again;
    std::optional<Clock::time_point> first_step_at;
    std::optional<std::int64_t> first_step;
    // The node's progress: the furthest step any of its workers had reported when the fault
    // fired, and when one first reported a step past it (the job going on, whoever's step).
    std::optional<std::int64_t> node_step_at_fault;
    std::optional<Clock::time_point> progress_at;
  };
  // The steps between where the target was and where its new process resumed; only after a
  // failure and a step of the new process.
  static std::optional<std::int64_t> steps_redone(const Entry& e);

  std::vector<Entry> entries_;
  int restarts_ = 0;
  std::map<int, std::int64_t> steps_;  // by local rank: the last step its running worker reported
};

}  // namespace ctrun::launcher
