// The fault report as a picture (`ctrun --fault_report=FILE.html`): a self-contained HTML page
// with a lane per worker (running, down, hung, slowed), each injected fault as a marker on its
// worker's lane, the steps each worker reported over time, and the report's table. Pure: the
// agent feeds it what happened, with its times, and writes the page (docs/faults.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

class FaultTimeline {
 public:
  using Clock = std::chrono::system_clock;
  // kDown: no process after a failure or a stop (a restart in progress); kDone: exited 0.
  enum class State { kRunning, kDown, kHung, kSlowed, kDone };

  // Workers run: all of this node's (`local_rank` empty; global ranks from `rank_offset`) or
  // one replaced alone. The first call starts the picture's clock.
  void workers_started(std::optional<int> local_rank, int rank_offset, int local_world_size,
                       Clock::time_point at);
  // A worker's process ended: `succeeded` (exit 0), or a failure or a stop.
  void worker_ended(int local_rank, bool succeeded, Clock::time_point at);
  // The agent stops every worker (a restart, a new round, a stop of the job): those still
  // running go down.
  void workers_stopped(Clock::time_point at);
  // A fault fired on `local_rank`; `effect` is the state it puts the worker in (kHung for a
  // hang, kSlowed for a straggler; kRunning for a signal or an exception, whose effect is the
  // worker's end).
  void fired(int fault_id, int local_rank, const std::string& what, State effect,
             Clock::time_point at);
  // A hang or a straggler on `local_rank` is over: it runs again.
  void effect_ended(int local_rank, Clock::time_point at);
  // A step the worker reported (kept at most every 50 ms per worker, and its last, and any
  // step lower than the one before: a restart from a checkpoint).
  void step(int local_rank, std::int64_t step, Clock::time_point at);

  // The page: `report` is the fault report's JSON (shown as a table, and embedded for tools as
  // <script type="application/json" id="fault-report">); `end` closes every lane.
  std::string html(const rendezvous::Json& report, Clock::time_point end) const;

 private:
  struct Segment {
    double from = 0;  // seconds since the first start
    double to = -1;   // -1: still open
    State state = State::kRunning;
  };
  struct Marker {
    int fault_id = 0;
    double at = 0;
    std::string what;
  };
  struct Lane {
    int rank = 0;  // the global rank it last ran as
    std::vector<Segment> segments;
    std::vector<Marker> markers;
    std::vector<std::pair<double, std::int64_t>> steps;  // (seconds, step), thinned
    std::pair<double, std::int64_t> latest;              // the last one reported
  };

  double seconds(Clock::time_point at) const;
  // Closes the lane's open segment at `t` and opens one in `state` (none for kDown at the end).
  void enter(int local_rank, State state, Clock::time_point at);

  bool started_ = false;
  Clock::time_point start_;
  std::map<int, Lane> lanes_;  // by local rank
};

}  // namespace ctrun::launcher
