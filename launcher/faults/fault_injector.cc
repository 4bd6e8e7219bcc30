#include "launcher/faults/fault_injector.h"

#include <csignal>

namespace ctrun::launcher {

namespace {
// A straggler's cycle: it runs `speed` of each period and is stopped for the rest.
constexpr auto kStragglerPeriod = std::chrono::milliseconds(200);

// The kinds that end the worker by its own hand or a signal: they land on a hung or slowed
// worker too (an exception or a CUDA error at its next step, once it runs).
bool ends_worker_itself(FaultKind kind) {
  return kind == FaultKind::kSignal || kind == FaultKind::kException ||
         kind == FaultKind::kCudaError;
}
}  // namespace

void FaultInjector::workers_started(int node, int rank_offset, int local_world_size,
                                    Clock::time_point now) {
  if (!started_) start_ = now;
  started_ = true;
  running_ = true;
  node_ = node;
  rank_offset_ = rank_offset;
  local_world_size_ = local_world_size;
  effects_.clear();
  steps_.clear();
}

void FaultInjector::workers_stopped() {
  running_ = false;
  effects_.clear();
  steps_.clear();
}

void FaultInjector::worker_replaced(int local_rank) {
  effects_.erase(local_rank);
  steps_.erase(local_rank);
}

void FaultInjector::add(Fault fault, Clock::time_point now) {
  if (!fault.at_step && started_) {
    fault.after += std::chrono::duration<double>(now - start_).count();
  }
  plan_.faults.push_back(std::move(fault));
  done_.push_back(false);
}

void FaultInjector::observe_step(int local_rank, std::int64_t step) { steps_[local_rank] = step; }

FaultInjector::Due FaultInjector::poll(Clock::time_point now) {
  Due due;
  if (!started_) return due;
  const auto elapsed = std::chrono::duration<double>(now - start_).count();
  for (std::size_t i = 0; i < plan_.faults.size() && running_; ++i) {
    const Fault& f = plan_.faults[i];
    if (done_[i]) continue;
    if (f.kind == FaultKind::kStoreLatency || f.kind == FaultKind::kRendezvousRestart) {
      // The rendezvous': its latency set off by node 0's agent (every job has a node 0), its
      // restart by the agent that hosts it.
      if (elapsed < f.after) continue;
      done_[i] = true;
      if (f.kind == FaultKind::kStoreLatency ? node_ != 0 : !hosts_rendezvous_) continue;
      due.fired.push_back({f.id, -1, -1, false, f.kind, describe_fault(f)});
      if (f.kind == FaultKind::kStoreLatency) {
        Action a{Action::Kind::kStoreLatency, -1, 0, f.id};
        a.ms = f.ms;
        a.seconds = f.duration;
        due.actions.push_back(a);
      } else {
        due.actions.push_back({Action::Kind::kStopRendezvous, -1, 0, f.id});
        Action end{Action::Kind::kStartRendezvous, -1, 0, f.id, true};
        node_effects_[f.id] = {end, now + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(f.duration))};
      }
      continue;
    }
    int local = -1;
    if (f.rank) {
      if (*f.rank >= rank_offset_ && *f.rank < rank_offset_ + local_world_size_) {
        local = *f.rank - rank_offset_;
      }
    } else if (*f.node == node_ && node_fault(f.kind)) {
      local = 0;  // the whole node
    } else if (*f.node == node_ && f.local_rank && *f.local_rank < local_world_size_) {
      local = *f.local_rank;
    }
    if (f.at_step) {
      // Due when its target, here, reports the step; another node's target is that node's.
      auto step = steps_.find(local);
      if (local < 0 || step == steps_.end() || step->second < *f.at_step) continue;
    } else if (elapsed < f.after) {
      continue;
    }
    // Due: fired here when its target runs on this node, else it is another node's.
    done_[i] = true;
    if (local < 0) continue;
    if (effects_.count(local) > 0) {
      // Already hung or straggling: a second stop means nothing; a signal still lands, and an
      // exception or a CUDA error at the worker's next step, once it runs.
      if (!ends_worker_itself(f.kind)) continue;
    }
    if (node_fault(f.kind) && f.kind != FaultKind::kNodeLost) {
      due.fired.push_back({f.id, -1, -1, false, f.kind, describe_fault(f)});
      Action begin{Action::Kind::kCutOff, -1, 0, f.id};
      begin.seconds = f.duration;
      begin.peer = f.peer.value_or(0);
      begin.path = f.path;
      Action end = begin;
      end.ends_effect = true;
      if (f.kind == FaultKind::kLinkLost) {
        begin.kind = Action::Kind::kLinkDown;
        end.kind = Action::Kind::kLinkUp;
      } else if (f.kind == FaultKind::kDiskFull) {
        begin.kind = Action::Kind::kFillDisk;
        end.kind = Action::Kind::kFreeDisk;
      }
      due.actions.push_back(begin);
      // A cut-off ends by itself (the agent refuses the rendezvous until then).
      if (f.kind != FaultKind::kCutOff) {
        node_effects_[f.id] = {end, now + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(f.duration))};
      }
      continue;
    }
    const bool ends_worker = ends_worker_itself(f.kind);
    due.fired.push_back(
        {f.id, rank_offset_ + local, local, ends_worker, f.kind, describe_fault(f)});
    switch (f.kind) {
      case FaultKind::kSignal:
        due.actions.push_back({Action::Kind::kSignal, local, f.signo, f.id});
        break;
      case FaultKind::kNodeLost:
        due.actions.push_back({Action::Kind::kNodeLost, local, SIGKILL, f.id});
        break;
      case FaultKind::kException:
      case FaultKind::kCudaError:
        due.actions.push_back({Action::Kind::kRaise, local, 0, f.id});
        break;
      case FaultKind::kStoreLatency:  // handled above: the rendezvous' or the node's
      case FaultKind::kRendezvousRestart:
      case FaultKind::kCutOff:
      case FaultKind::kLinkLost:
      case FaultKind::kDiskFull:
        break;
      case FaultKind::kHang:
      case FaultKind::kStraggler: {
        Effect& e = effects_[local] = Effect{};
        e.fault_id = f.id;
        e.began = now;
        e.ends = now + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(f.duration));
        if (f.kind == FaultKind::kHang) {
          e.forever = f.duration <= 0;
          e.stopped = true;
          due.actions.push_back({Action::Kind::kStop, local, SIGSTOP, f.id});
        } else {
          e.straggler = true;  // running now; stopped once its first period's share is used
          e.speed = f.speed;
        }
        break;
      }
    }
  }
  for (auto it = effects_.begin(); it != effects_.end();) {
    auto& [local, e] = *it;
    if (!e.forever && now >= e.ends) {
      // Sent also to a straggler caught running: a SIGCONT to a running group does nothing.
      due.actions.push_back({Action::Kind::kContinue, local, SIGCONT, e.fault_id, true});
      it = effects_.erase(it);
      continue;
    }
    if (e.straggler) {
      const auto into = (now - e.began) % kStragglerPeriod;
      const bool run = std::chrono::duration<double>(into).count() <
                       e.speed * std::chrono::duration<double>(kStragglerPeriod).count();
      if (run == e.stopped) {
        e.stopped = !run;
        due.actions.push_back({run ? Action::Kind::kContinue : Action::Kind::kStop, local,
                               run ? SIGCONT : SIGSTOP, e.fault_id});
      }
    }
    ++it;
  }
  for (auto it = node_effects_.begin(); it != node_effects_.end();) {
    if (now < it->second.ends) {
      ++it;
      continue;
    }
    due.actions.push_back(it->second.end);
    it = node_effects_.erase(it);
  }
  return due;
}

std::vector<FaultInjector::Action> FaultInjector::end_node_faults() {
  std::vector<Action> out;
  for (const auto& [id, effect] : node_effects_) out.push_back(effect.end);
  node_effects_.clear();
  return out;
}

std::vector<int> FaultInjector::stopped_workers() const {
  std::vector<int> out;
  for (const auto& [local, e] : effects_) {
    if (e.stopped) out.push_back(local);
  }
  return out;
}

bool FaultInjector::pending() const {
  if (!node_effects_.empty()) return true;
  if (!effects_.empty()) {
    for (const auto& [local, e] : effects_) {
      if (!e.forever) return true;
    }
  }
  for (bool d : done_) {
    if (!d) return true;
  }
  return false;
}

}  // namespace ctrun::launcher
