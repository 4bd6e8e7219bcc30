// The per-step quorum of a fault-tolerant job on etcd (ctrun --fault_tolerance=step with
// --rdzv_backend=etcd). etcd runs no logic, so the replicas run the one `Quorum`
// (core/quorum.h) themselves, on the job's key "quorum/state" by compare-and-swap, as the
// agents run their Rendezvous: each ask reads the state and who is alive, applies the ask and
// writes the state back; a replica whose ask did not form the quorum watches the keys until a
// write formed one (its answer is then in the state) or a deadline is due. A replica is alive
// while its key "quorum/alive/<replica>" on its own lease exists: its lease's TTL is the
// heartbeat timeout in whole seconds (etcd may grant more), renewed by every ask and heartbeat.
// Unlike ctrund, which sees a dead replica's connection close, etcd learns of a death when the
// lease expires.
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/quorum.h"
#include "rendezvous/etcd/kv.h"

namespace ctrun::rendezvous {

// Where job `job`'s quorum keys are: "<job prefix>quorum/" (etcd_jobs.h's layout).
std::string etcd_quorum_prefix(const std::string& job);

class EtcdQuorum {
 public:
  // `client` serves this quorum alone (a wait cancels its watches).
  EtcdQuorum(etcd::Kv& client, const std::string& job, std::string replica_id, const Clock& clock);

  // Asks for the next step's quorum as ctrund's `quorum` op does (request.member must be this
  // replica) and returns this replica's assignment; kTimeout after `timeout` without one. A
  // `finished` request is answered at once and revokes the lease: the replica leaves.
  etcd::Task<Result<QuorumAssignment>> ask(QuorumRequest request, Duration timeout);
  // Renews the lease (granted again, with the alive key, if it expired): proof of life
  // between asks. Nothing to do before the first ask.
  etcd::Task<Status> heartbeat();
  // Revokes the lease: the others learn at once that this replica is gone.
  etcd::Task<Status> leave();

  const std::string& state_key() const { return state_key_; }
  const std::string& alive_prefix() const { return alive_prefix_; }

 private:
  // The lease and the alive key exist, renewed when a third of the TTL has passed (`force`:
  // now).
  etcd::Task<Status> stay_alive(bool force);

  etcd::Kv& client_;
  const Clock& clock_;
  const std::string replica_id_;
  const std::string prefix_;
  const std::string state_key_;
  const std::string alive_prefix_;
  std::int64_t ttl_seconds_ = 0;  // 0: no ask yet
  std::int64_t lease_ = 0;        // 0: none held
  TimePoint renewed_{};
};

}  // namespace ctrun::rendezvous
