// A replica's asks for the per-step quorum, kept going across a daemon that went away: the
// connection is made again (and the next quorum asked for with a new communicator, since the
// restarted daemon's first quorum is a new one) until the quorum timeout. Torch-free; shared by
// FaultTolerance and the Python workers' proxy (worker_proxy.h). Thread-safe: one call at a
// time goes to the quorum; a heartbeat skips while an ask is in flight (an ask is proof of life).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ctrun/rendezvous/quorum.h"
#include "ctrun/worker/env.h"
#include "ctrun/worker/step_quorum.h"

namespace ctrun::worker {

class QuorumAsker {
 public:
  // Connects at once (within `connect_timeout`): a worker that cannot reach its quorum learns it
  // when it starts.
  static Result<std::unique_ptr<QuorumAsker>> connect(const WorkerEnv& env,
                                                      rendezvous::QuorumConfig config,
                                                      std::chrono::milliseconds connect_timeout);

  // The quorum of the step after `committed`; `rebuild`: this replica's communicator failed
  // (or it has none). Errors: kTimeout when no quorum formed and none could be reached within
  // `within`; another error of the service as it came.
  Result<rendezvous::QuorumAssignment> ask(std::int64_t committed, bool rebuild,
                                           std::chrono::milliseconds within);
  // Proof of life between asks; nothing when an ask is in flight or there is no connection.
  void heartbeat_if_idle();
  // The training ended at `step` for this replica (StepQuorum::finish).
  rendezvous::Status finish(std::int64_t step, std::chrono::milliseconds within);

  const rendezvous::QuorumConfig& config() const { return config_; }

 private:
  QuorumAsker(WorkerEnv env, rendezvous::QuorumConfig config, std::unique_ptr<StepQuorum> quorum);

  const WorkerEnv env_;
  const rendezvous::QuorumConfig config_;
  std::mutex mutex_;
  std::unique_ptr<StepQuorum> quorum_;  // null after the daemon went away, until reconnected
  bool reconnected_ = false;            // the next ask asks for a new communicator
};

}  // namespace ctrun::worker
