#include "launcher/faults/fault_report.h"

#include <algorithm>

#include "rendezvous/base/event_log.h"

namespace ctrun::launcher {

namespace {

using rendezvous::Json;

long long ms_between(FaultReport::Clock::time_point a, FaultReport::Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

}  // namespace

std::optional<std::int64_t> FaultReport::steps_redone(const Entry& e) {
  if (!e.first_step || !e.step_at_fault || !e.detected) return std::nullopt;
  return std::max<std::int64_t>(0, *e.step_at_fault - (*e.first_step - 1));
}

void FaultReport::fired(int fault_id, const std::string& what, int rank, int local_rank,
                        bool ends_worker, std::optional<std::int64_t> step, Clock::time_point at) {
  Entry e;
  e.ends_worker = ends_worker;
  e.fault_id = fault_id;
  e.what = what;
  e.rank = rank;
  e.local_rank = local_rank;
  e.step_at_fault = step;
  e.fired = at;
  for (const auto& [local, reported] : steps_) {
    e.node_step_at_fault = std::max(e.node_step_at_fault.value_or(reported), reported);
  }
  // A fault of the whole node was at the node's step.
  if (local_rank < 0 && !e.step_at_fault) e.step_at_fault = e.node_step_at_fault;
  entries_.push_back(std::move(e));
}

void FaultReport::worker_failed(int local_rank, Clock::time_point at) {
  for (auto& e : entries_) {
    // A fault whose worker went on to a step is over: a later failure is another's.
    if (e.detected || e.first_step) continue;
    // A fault of the node (or the rendezvous), local rank -1: any of its workers' failure.
    if (e.local_rank == local_rank || e.local_rank < 0) {
      e.detected = at;
    } else if (e.ends_worker && !e.peer_failed) {
      e.peer_failed = at;
    }
  }
}

void FaultReport::workers_stopped(Clock::time_point at) {
  // The latest fault of the whole node not yet seen: its effect may come after the node went on
  // for a while (a cut-off node keeps training until it reconnects and finds itself dropped),
  // so what it did before the stop was not its recovery: measured again from the restart.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->local_rank >= 0 || it->detected) continue;
    it->detected = at;
    it->first_step.reset();
    it->first_step_at.reset();
    it->progress_at.reset();
    break;
  }
}

void FaultReport::workers_started(std::optional<int> local_rank, Clock::time_point at) {
  // New processes: their steps are yet to come (a resumed one starts below the old ones).
  if (local_rank) {
    steps_.erase(*local_rank);
  } else {
    steps_.clear();
  }
  for (auto& e : entries_) {
    if (!local_rank && !e.detected && e.peer_failed) e.detected = e.peer_failed;
    if (!e.detected || e.running_again) continue;
    if (!local_rank || *local_rank == e.local_rank) e.running_again = at;
    // The whole group restarted for this fault: steps its other workers reported before they
    // were stopped are done again, so they were not progress.
    if (!local_rank) e.progress_at.reset();
  }
}

void FaultReport::step_reported(int local_rank, std::int64_t step, Clock::time_point at) {
  steps_[local_rank] = step;
  for (auto& e : entries_) {
    if (!e.progress_at && e.node_step_at_fault && step > *e.node_step_at_fault) {
      e.progress_at = at;
    }
  }
  for (auto& e : entries_) {
    if ((e.local_rank != local_rank && e.local_rank >= 0) || e.first_step) continue;
    // After a signal, the first step of the new process; a hang resumed or a straggler counts
    // the first step after it fired (unless it killed the worker too: a watchdog).
    if ((e.ends_worker || e.detected) && !e.running_again) continue;
    if (!e.detected && e.step_at_fault && step <= *e.step_at_fault) continue;
    e.first_step = step;
    e.first_step_at = at;
  }
}

Json FaultReport::json(const std::string& outcome) const {
  Json faults = Json::array();
  for (const auto& e : entries_) {
    Json j = {{"fault", e.fault_id},
              {"what", e.what},
              {"rank", e.rank},
              {"local_rank", e.local_rank},
              {"fired", rendezvous::utc_stamp(e.fired)}};
    if (e.step_at_fault) j["step_at_fault"] = *e.step_at_fault;
    if (e.detected) {
      j["worker_exit"] = rendezvous::utc_stamp(*e.detected);
      j["worker_exit_ms"] = ms_between(e.fired, *e.detected);
    }
    if (e.running_again) {
      j["running_again"] = rendezvous::utc_stamp(*e.running_again);
      j["running_again_ms"] = ms_between(e.fired, *e.running_again);
    }
    if (e.first_step) {
      j["first_step"] = *e.first_step;
      j["first_step_at"] = rendezvous::utc_stamp(*e.first_step_at);
      j["first_step_ms"] = ms_between(e.fired, *e.first_step_at);
      if (auto redone = steps_redone(e)) j["steps_redone"] = *redone;
    }
    if (e.progress_at) {
      j["node_step_at_fault"] = *e.node_step_at_fault;
      j["progress_ms"] = ms_between(e.fired, *e.progress_at);
    }
    faults.push_back(std::move(j));
  }
  return Json{{"outcome", outcome}, {"restarts", restarts_}, {"faults", std::move(faults)}};
}

std::vector<std::string> FaultReport::lines() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) {
    // Rank -1: a fault of the whole node or of the rendezvous, which its line says already.
    std::string line = "fault " + std::to_string(e.fault_id) +
                       (e.rank >= 0 ? " (rank " + std::to_string(e.rank) + "):" : ":");
    if (e.detected) {
      line += " worker exit after " + std::to_string(ms_between(e.fired, *e.detected)) + " ms,";
    }
    if (e.running_again) {
      line +=
          " running again after " + std::to_string(ms_between(e.fired, *e.running_again)) + " ms,";
    }
    if (e.first_step) {
      line += " step " + std::to_string(*e.first_step) + " after " +
              std::to_string(ms_between(e.fired, *e.first_step_at)) + " ms";
      if (auto redone = steps_redone(e)) line += " (" + std::to_string(*redone) + " steps redone)";
    } else {
      line += " no step reported after it";
    }
    if (e.progress_at) {
      line += "; the node past step " + std::to_string(*e.node_step_at_fault) + " after " +
              std::to_string(ms_between(e.fired, *e.progress_at)) + " ms";
    }
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace ctrun::launcher
