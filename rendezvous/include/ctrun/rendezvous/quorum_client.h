// What a fault-tolerant worker asks each step's quorum of (ctrun --fault_tolerance=step;
// docs/fault_tolerance.md): ctrund's `quorum` op on the worker's own connection, or the quorum
// the replicas keep on etcd themselves. Blocking, one call at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/quorum.h"
#include "ctrun/rendezvous/store_address.h"

namespace ctrun::rendezvous {

class QuorumClient {
 public:
  virtual ~QuorumClient() = default;

  // Asks for the next step's quorum and waits for it to form (up to `timeout`; then kTimeout,
  // and the next ask supersedes this one). From the first ask on, this client speaks for the
  // replica: once it is gone (its connection closed, its etcd lease expired or revoked), so is
  // the replica.
  virtual Result<QuorumAssignment> quorum(const QuorumRequest& request,
                                          std::optional<Duration> timeout = {}) = 0;
  // Proof of life during a step longer than the quorum's heartbeat timeout; kTimeout when no
  // answer came within `timeout` (bounded: a beat sent into a cut link must not hold the
  // client, and the asks behind it, for good).
  virtual Status quorum_heartbeat(const std::string& replica, Duration timeout) = 0;
};

// The quorum of job `job` at `address` for replica `replica_id`: a connection to ctrund
// (retried until `timeout`), or an etcd client for the members listed (no call is made until
// the first ask; each call tries the members for at most min(`timeout`, 15 s)).
Result<std::unique_ptr<QuorumClient>> connect_quorum(const StoreAddress& address,
                                                     const std::string& job,
                                                     const std::string& replica_id,
                                                     Duration timeout);

}  // namespace ctrun::rendezvous
