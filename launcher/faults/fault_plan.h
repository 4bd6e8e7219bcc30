// A fault plan (`ctrun --faults=...`): which faults to inject into the job's workers, where and
// when. Read from a JSON file, an inline one-liner, or drawn from a seed; the same seed always
// gives the same plan, printed as JSON so that a run found at random replays exactly. Pure: no
// files, no clock (docs/faults.md).
//
//   JSON    {"seed": 7, "faults": [{"kind": "kill", "rank": 3, "at_step": 200},
//             {"kind": "hang", "rank": 1, "window": [10, 40], "duration": 15},
//             {"kind": "straggler", "node": 1, "local_rank": 0, "after": 5, "duration": 30,
//              "speed": 0.25}]}
//   inline  kill:rank=3,after=20;hang:rank=1,window=10-40,duration=15
//   random  random:seed=7,count=5,kinds=kill+hang+straggler,ranks=0-7,window=10-60
//           (or steps=100-900 for a step drawn in that range instead of a time)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

enum class FaultKind {
  kSignal,     // a signal to the worker process (kill, term, int, segv, abrt)
  kHang,       // SIGSTOP to the worker's process group; SIGCONT after `duration` (0: never)
  kStraggler,  // stopped and continued in turn for `duration`, running `speed` of the time
  kNodeLost,   // the node's agent and workers killed together (SIGKILL), as a machine that dies
  kException,  // an exception raised inside the worker at its next reported step (CTRUN_FAULT_FILE)
  // A CUDA error in the worker at its next reported step: a kernel on its GPU that fails (a
  // device-side assert), which leaves the process's CUDA context broken as a GPU fault does.
  kCudaError,
  // The rendezvous daemon (ctrund, or an agent's embedded one) answers the job's requests `ms`
  // late for `duration` seconds; fired by node 0's agent through the job's store.
  kStoreLatency,
  // The node's agent cut off from the rendezvous for `duration` seconds: its connections dropped
  // (the daemon sees them close) and every attempt to reach it refused until the time is up.
  kCutOff,
  // The network link between the node and node `peer` lost for `duration` seconds: packets to
  // and from the peer's address dropped on the node's interface towards it (tc; root only).
  kLinkLost,
  // The filesystem that holds `path` (the checkpoint directory) full for `duration` seconds: a
  // file in `path` takes all its free space.
  kDiskFull,
  // The rendezvous this ctrun hosts (--standalone, --hostfile, an agent hosting c10d) killed:
  // every connection closed, restarted from its state files `duration` seconds later.
  kRendezvousRestart,
};

struct Fault {
  int id = 0;  // 1, 2, ... in the plan's order
  FaultKind kind = FaultKind::kSignal;
  int signo = 0;  // kSignal
  // Where: a global rank, or a node (group rank) and a local rank on it; a lost node: a node,
  // or the node of a rank.
  std::optional<int> rank;
  std::optional<int> node;
  std::optional<int> local_rank;
  // When: seconds after the node's first workers started (a window [a, b] is drawn from the
  // plan's seed when the plan is read, so every agent of the job draws the same time), or once
  // the target worker has reported step `at_step` (CTRUN_HEARTBEAT_FILE; worker/heartbeat.h).
  double after = 0;
  std::optional<std::int64_t> at_step;
  // kHang: 0 = never resumed; kStraggler, kCutOff, kLinkLost, kDiskFull: > 0;
  // kRendezvousRestart: how long the rendezvous stays down.
  double duration = 0;
  double speed = 0.5;       // kStraggler: the share of time it runs, in (0, 1)
  double ms = 0;            // kStoreLatency: how late each answer is
  std::optional<int> peer;  // kLinkLost: the node at the link's other end
  std::string path;         // kDiskFull: a directory on the filesystem to fill
};

// Faults of a whole node (its agent, its links, its disk) rather than of one worker.
bool node_fault(FaultKind kind);

struct FaultPlan {
  std::uint64_t seed = 0;
  std::vector<Fault> faults;
};

// The value of --faults, read as a plan: `json_file` is the text of the file the value names
// when it names one (the caller reads it), else empty and the value is an inline plan or a
// random one. Errors name the fault and what was wrong ("--faults: fault 2: ...").
rendezvous::Result<FaultPlan> parse_fault_plan_json(const std::string& text,
                                                    const std::string& source);
rendezvous::Result<FaultPlan> parse_inline_fault_plan(const std::string& text);
rendezvous::Result<FaultPlan> random_fault_plan(const std::string& spec);

// `ctrun fault FAULT`: one fault in the inline form, to inject into a running job. Without a
// time or a step it fires at once; a time counts from when the agents read it. Returns the
// fault as a plan's JSON holds it (what the agents read from the job's store).
rendezvous::Result<rendezvous::Json> parse_fault_request(const std::string& text);

// The plan as JSON, windows resolved: what --faults reads back to replay the very same faults.
rendezvous::Json fault_plan_json(const FaultPlan& plan);
// "kill rank 3 at 20.0 s", for the agent's lines.
std::string describe_fault(const Fault& fault);

}  // namespace ctrun::launcher
