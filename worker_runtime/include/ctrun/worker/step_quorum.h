// A worker's side of the per-step quorum (ctrun --fault_tolerance=step; docs/fault_tolerance.md):
// the worker's own way to the job's quorum, on which it asks for each step's quorum. On ctrund
// it is a connection that speaks for the worker's replica: when the worker dies the kernel
// closes it, and the quorum lets the replica go at once. On etcd it is the replica's lease,
// which goes when the worker leaves or, if it dies, when the lease expires.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ctrun/rendezvous/quorum.h"
#include "ctrun/rendezvous/quorum_client.h"
#include "ctrun/worker/env.h"

namespace ctrun::worker {

class StepQuorum {
 public:
  // Needs a worker started with CTRUN_FAULT_TOLERANCE=step and given its job's store (ctrund's
  // or etcd's); other workers get an error that says which of those is missing. `config` is the
  // job's quorum settings, the same on every replica.
  static Result<std::unique_ptr<StepQuorum>> connect(const WorkerEnv& env,
                                                     rendezvous::QuorumConfig config,
                                                     rendezvous::Duration connect_timeout);

  // The quorum of the step after `committed_step` (the last step this replica committed);
  // `address` is where peers fetch this replica's state. kTimeout after `timeout`: no quorum
  // formed (e.g. this replica is on a partition's minority side). `rebuild`: this replica's
  // communicator failed; the quorum gets a new id so that every member builds a new one.
  Result<rendezvous::QuorumAssignment> next(std::int64_t committed_step, const std::string& address,
                                            rendezvous::Duration timeout, bool rebuild = false);
  // This replica finished the training at `step`: it leaves the quorum, and replicas that ask
  // from now on learn that the training is over (QuorumAssignment::finished).
  rendezvous::Status finish(std::int64_t step, rendezvous::Duration timeout);
  // Proof of life during a step longer than the quorum's heartbeat timeout, waiting at most that
  // long for its answer.
  rendezvous::Status heartbeat();

  const std::string& replica_id() const { return replica_id_; }

 private:
  StepQuorum(std::unique_ptr<rendezvous::QuorumClient> client, std::string replica_id,
             rendezvous::QuorumConfig config);
  std::unique_ptr<rendezvous::QuorumClient> client_;
  std::string replica_id_;
  rendezvous::QuorumConfig config_;
};

}  // namespace ctrun::worker
