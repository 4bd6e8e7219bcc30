// Per-step fault tolerance for a C++ trainer (ctrun --fault_tolerance=step;
// docs/fault_tolerance.md): every step trains on a quorum of the job's replicas and commits only
// when all of them finished it, so a failure costs the step it happened in, not a restart.
//
//   auto ft = FaultTolerance::start(env, options, {module, &optimizer, &sampler}).value();
//   DdpOptions ddp_options;
//   ddp_options.broadcast_parameters = false;  // replicas heal from each other instead
//   DistributedDataParallel ddp(module, ft->group(), ddp_options);
//   for (;;) {
//     const auto step = ft->begin_step();
//     batch = sampler.step(step.rank, step.size); forward; backward;  // collectives on group()
//     if (ft->should_commit()) optimizer.step();  // else: the same samples again, next step
//     optimizer.zero_grad();
//   }
//
// A collective that fails (a peer died, hung, or its link went down) does not throw: the step is
// lost and should_commit() says so. The next begin_step() asks for a new quorum, builds a new
// communicator among its members in this process, and brings a replica that is behind (new, or
// one that missed the last commit) up to date from a peer: parameters, optimizer state, sampler
// position, random generator. Committed parameters are bit-identical on every live replica.
//
// Sharded replicas (HSDP; shard_group_size S > 1): the S workers of a group (local ranks of one
// node) shard one replica's state among themselves with ShardedDataParallel over
// shard_group(), and the groups replicate it, averaging each shard over replicate_group():
//
//   auto ft = FaultTolerance::start(env, options, {module.get(), nullptr, &sampler}).value();
//   ShardingOptions sharding;                 // any stage
//   sharding.broadcast_parameters = false;
//   sharding.gather_in_step = false;          // step() issues no collective after the commit
//   sharding.replicate_group = &ft->replicate_group();
//   ShardedDataParallel sharded(module, ft->shard_group(), sharding);
//   Adam optimizer(sharded.shard_parameters());
//   ft->set_state({module.get(), &optimizer, &sampler, &sharded});
//   ... the loop above, with sharded.forward(...) and sharded.step(optimizer) ...
//
// Only whole groups train: a group that lost a worker waits (its members keep asking) until
// the replacement came, which then takes its shard from the same slot of another group. A
// step commits on a vote of every training worker, so a group's workers commit together. A
// quorum of one whole group holds one copy of each shard: a failure in it loses that state,
// and the job stops with an error saying so (resume it from a checkpoint).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ctrun/rendezvous/quorum.h"
#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"
#include "ctrun/worker/torch_forward.h"

namespace ctrun::worker {

class ShardedDataParallel;
class StepSampler;

// The timeouts work together as one hierarchy (check_timeouts):
//   collective < join < quorum, and heartbeat < quorum.
// A collective that waits on a dead or stuck peer fails after `collective_timeout`; the quorum
// waits for a member that has not asked up to `join_timeout`, which must be longer, or it would
// leave out a live replica still waiting for its collective to fail; a member silent for
// `heartbeat_timeout` is dead at once; and a replica gives up on getting a quorum (it is on the
// minority side of a partition, or the job lost its majority) after `quorum_timeout`.
struct FaultToleranceOptions {
  Backend backend = Backend::kGloo;
  int min_replicas = 1;
  // The replicas of the whole job; 0: WORLD_SIZE. The first quorum forms as soon as all came.
  int max_replicas = 0;
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(5);
  std::chrono::milliseconds join_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds quorum_timeout = std::chrono::minutes(5);
  // Ask for the next quorum in the background while the step's forward pass runs, trusting the
  // last one; when it turns out changed, the step is redone under the new one.
  bool overlap_quorum = true;
  // The step this replica's state is at when it starts (a checkpoint's; 0: fresh).
  std::int64_t committed_step = 0;
  // HSDP: the workers of a replica, local ranks [k S, (k + 1) S) of one node, shard its state
  // (see above); must divide LOCAL_WORLD_SIZE. 1: every worker is a replica of its own.
  int shard_group_size = 1;
};

// Empty when the options are consistent; otherwise one line naming the values that contradict
// the hierarchy, e.g. "fault tolerance: the collective timeout (60000 ms) must be shorter than
// the join timeout (30000 ms): ...".
std::string check_timeouts(const FaultToleranceOptions& options);

// What a replica hands to a peer that heals from it. module and optimizer are required; the
// sampler, when given, is restored to the peer's place and committed by should_commit(). With
// `sharded`, the parameters handed over are its shards (the optimizer steps them).
struct ReplicaState {
  torch::nn::Module* module = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  StepSampler* sampler = nullptr;
  ShardedDataParallel* sharded = nullptr;
};

class FaultTolerance {
 public:
  // Connects to the job's quorum (ctrund) as the replica CTRUN_REPLICA_ID; an error names what
  // is missing or contradictory (the mode not on, no ctrund store, the timeouts, the shard
  // group size). With shard groups the optimizer may come later, through set_state().
  static Result<std::unique_ptr<FaultTolerance>> start(const WorkerEnv& env,
                                                       FaultToleranceOptions options,
                                                       ReplicaState state);
  ~FaultTolerance();
  FaultTolerance(const FaultTolerance&) = delete;
  FaultTolerance& operator=(const FaultTolerance&) = delete;

  // The group the step's collectives go through: one object for the whole run, whose rank and
  // size are the current quorum's. Its collectives never throw: a failure loses the step.
  // With shard groups: every training worker of the step (Step::rank and Step::size).
  ProcessGroup& group();
  // With shard groups: this worker's group (rank: its index in it, size: shard_group_size, for
  // the whole run), and the workers holding the same shard in the step's other groups (rank:
  // this group's number, size: the groups training the step). Like group(), they never throw.
  ProcessGroup& shard_group();
  ProcessGroup& replicate_group();
  // Replaces what heals and is healed (before the first begin_step(): sharded, the optimizer
  // and the wrapper exist only once shard_group() does).
  void set_state(ReplicaState state);

  struct Step {
    std::int64_t step = 0;  // the step being trained: committed_step() + 1
    int rank = 0;           // this replica's rank among the step's training workers, and their
    int size = 1;           // count: the share of the step's samples this replica trains
    // The job's other replicas finished the training (at `step`) while this one was being
    // started or healed: nothing is left to train; end as they did, without should_commit().
    bool finished = false;
  };
  // Starts a step. The first (and every one after a lost step, or with overlap_quorum off)
  // waits for the quorum, and builds the communicator and heals this replica when needed. A
  // worker whose shard group is not whole waits here, asking again at every quorum.
  // Throws std::runtime_error when no quorum forms within the quorum timeout: this replica must
  // not train on alone.
  Step begin_step();
  // Whether the step commits: true when the quorum was the one the step began under and every
  // collective of the step succeeded here, so this replica holds the quorum's averaged
  // gradients. Then the caller applies the optimizer step, and the sampler, if given, has moved
  // past the step's samples. false: the caller discards the gradients; the next step trains the
  // same samples again. A member that did not commit a step its peers committed is behind, and
  // heals from them before its next step. With shard groups the training workers vote: the
  // step commits on all of them or on none. Throws like begin_step().
  bool should_commit();

  // This replica finished the training: the quorum lets it go, and a replica that asks later
  // (a replacement started after the end) learns that nothing is left (Step::finished).
  // Call once, after the last should_commit(); an error to reach the daemon is only logged.
  void finish();

  std::int64_t committed_step() const;
  // The quorum the last step ran under (valid after the first begin_step()).
  const rendezvous::QuorumAssignment& quorum() const;

  struct Stats {
    std::int64_t steps_committed = 0;
    std::int64_t steps_lost = 0;      // begun but not committed (redone)
    std::int64_t rebuilds = 0;        // communicators built
    std::int64_t heals_received = 0;  // times this replica took its state from a peer
    std::int64_t heals_sent = 0;
    std::int64_t quorums_sat_out = 0;  // shard groups: quorums in which this group was not whole
  };
  Stats stats() const;

  class Impl;

 private:
  explicit FaultTolerance(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun::worker
