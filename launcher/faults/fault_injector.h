// One agent's side of a fault plan (fault_plan.h): which of its workers a due fault hits, and
// the signals that carry it out (a signal, SIGSTOP and SIGCONT for a hang, the two in turn for a
// straggler). Every agent of the job holds the same plan and fires only the faults whose target
// runs on its node when they fall due. Pure: the agent feeds it its workers and the time, and
// sends what it returns (docs/faults.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launcher/faults/fault_plan.h"

namespace ctrun::launcher {

class FaultInjector {
 public:
  using Clock = std::chrono::steady_clock;

  struct Action {
    // kNodeLost: the agent kills its workers and itself (SIGKILL). kRaise: the worker is told
    // to raise an exception, or make a CUDA error, at its next reported step (CTRUN_FAULT_FILE;
    // the fired fault's kind says which). kStoreLatency: the rendezvous is told to answer `ms`
    // late for `seconds` (no worker: local_rank -1). The
    // node's own (local_rank -1), each begun and, `seconds` later, ended: kCutOff (the agent
    // refuses itself the rendezvous for `seconds`; it ends by itself), kLinkDown/kLinkUp (the
    // link to node `peer`), kFillDisk/kFreeDisk (`path`'s filesystem), kStopRendezvous/
    // kStartRendezvous (the one this agent hosts).
    enum class Kind {
      kSignal,
      kStop,
      kContinue,
      kNodeLost,
      kRaise,
      kStoreLatency,
      kCutOff,
      kLinkDown,
      kLinkUp,
      kFillDisk,
      kFreeDisk,
      kStopRendezvous,
      kStartRendezvous,
    };
    Kind kind = Kind::kSignal;
    int local_rank = 0;
    int signo = 0;  // kSignal
    int fault_id = 0;
    bool ends_effect = false;  // the continue that ends a hang or a straggler
    double ms = 0;             // kStoreLatency
    double seconds = 0;        // kStoreLatency, kCutOff
    int peer = 0;              // kLinkDown, kLinkUp
    std::string path{};        // kFillDisk, kFreeDisk
  };
  struct Fired {
    int fault_id = 0;
    int rank = 0;              // the global rank hit; -1 for the rendezvous or the whole node
    int local_rank = 0;        // -1 for the rendezvous or the whole node
    bool ends_worker = false;  // a signal or an exception (not a hang or a straggler)
    FaultKind kind = FaultKind::kSignal;
    std::string line;  // "fault 2: SIGKILL to rank 3 at 20.000 s", as the agent logs it
  };
  struct Due {
    std::vector<Action> actions;
    std::vector<Fired> fired;
  };

  explicit FaultInjector(FaultPlan plan)
      : plan_(std::move(plan)),
        done_(plan_.faults.size()),
        planned_(static_cast<int>(plan_.faults.size())) {}

  // This node's workers of a round: its group rank, its first global rank and worker count.
  // The first call starts the plan's clock.
  void workers_started(int node, int rank_offset, int local_world_size, Clock::time_point now);
  // Every worker stopped (a restart, a re-formed round, the end): what was done to them ends
  // with them, and nothing is resumed in their place. Faults not yet due stay planned.
  void workers_stopped();
  // One worker replaced alone (--fault_tolerance=step): the same for it.
  void worker_replaced(int local_rank);

  // A fault asked for while the job runs (`ctrun fault`), with its own id: its `after` counts
  // from `now` (0: at once), not from the start; at a step, from the step.
  void add(Fault fault, Clock::time_point now);
  // How many faults the plan held at the start: ids past it are faults asked for later.
  int planned() const { return planned_; }
  // Whether this agent hosts the rendezvous: a rendezvous restart is its to fire.
  void set_hosts_rendezvous(bool hosts) { hosts_rendezvous_ = hosts; }

  // The step a worker of this node last reported (its CTRUN_HEARTBEAT_FILE), for the faults
  // planned at a step.
  void observe_step(int local_rank, std::int64_t step);

  // What is due at `now`: faults that fire (each once in the job), and the stops and continues
  // of hangs and stragglers.
  Due poll(Clock::time_point now);
  // Whether anything is left to do on this node: a fault not yet due, a hang to resume, a
  // straggler running, a node's fault to end.
  bool pending() const;
  // The agent is ending: the ends of the node's faults in progress (a link back, the disk
  // freed, the rendezvous started again), so that none outlives it.
  std::vector<Action> end_node_faults();
  // The workers this plan holds stopped right now (a hang, a straggler's pause): a stop of the
  // group continues them after its signal, so that they see it.
  std::vector<int> stopped_workers() const;

 private:
  // A hang or straggler in progress on one of this node's workers.
  struct Effect {
    int fault_id = 0;
    Clock::time_point began;
    Clock::time_point ends;  // hang without a duration: never
    bool forever = false;
    bool straggler = false;
    double speed = 1;
    bool stopped = false;
  };

  // A fault of the node in progress, by fault id: what ends it and when. Workers' restarts do
  // not end it: it is the node's, not theirs.
  struct NodeEffect {
    Action end;
    Clock::time_point ends;
  };

  FaultPlan plan_;
  std::map<int, NodeEffect> node_effects_;
  bool hosts_rendezvous_ = false;
  std::vector<bool> done_;  // by fault index: fired here, or due while its target ran elsewhere
  int planned_ = 0;
  bool started_ = false;
  bool running_ = false;
  Clock::time_point start_;
  int node_ = 0;
  int rank_offset_ = 0;
  int local_world_size_ = 0;
  std::map<int, Effect> effects_;      // by local rank
  std::map<int, std::int64_t> steps_;  // by local rank: the last step its worker reported
};

}  // namespace ctrun::launcher
