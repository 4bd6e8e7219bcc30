// What a fault-tolerant job's replicas and the quorum service say to each other about each
// step's quorum (ctrun --fault_tolerance=step): a replica's ask, the settings of the job's
// quorum, and the assignment a replica gets when the quorum forms. The rules that form it are
// the service's (docs/fault_tolerance.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

struct QuorumConfig {
  int min_replicas = 1;
  // The replicas the job runs with when whole (0: unknown): the first quorum forms as soon as
  // that many have asked, instead of after the join timeout.
  int max_replicas = 0;
  // How long a formation waits for a member of the previous quorum that has not asked (and is
  // not known dead), from the first ask of the formation.
  Duration join_timeout = std::chrono::milliseconds(500);
  // A replica not heard from (ask or heartbeat) for this long is dead: not waited for.
  Duration heartbeat_timeout = std::chrono::seconds(5);
};
Status validate(const QuorumConfig& config);

struct QuorumMember {
  std::string replica_id;  // stable across a replacement (the replica's slot, not its process)
  std::int64_t step = 0;   // the last step it committed
  std::string address;     // where a recovering replica fetches the state from it
};

// What one replica learns when a quorum forms.
struct QuorumAssignment {
  std::int64_t quorum_id = 0;
  std::vector<QuorumMember> members;  // by replica_id
  int rank = 0;                       // this replica's index in members
  std::int64_t max_step = 0;          // the step the quorum trains from
  // When this replica is behind (its step < max_step): the up-to-date member it heals from.
  // Sources are spread round-robin over the up-to-date members.
  std::optional<int> heal_from;
  // Where the quorum's communicator meets in the job's store: a new prefix per quorum id
  // (Quorum's store_root + "<quorum id>/").
  std::string store_prefix;
  // The job's replicas finished the training at max_step (a replica said so): nothing is left
  // to train. Then members holds only the asking replica and store_prefix is empty.
  bool finished = false;
};
Json to_json(const QuorumAssignment& a);

// Who heals whom in a quorum: for each member (by index), the up-to-date member it fetches the
// state from, or nullopt when it is up to date itself. Behind members take the up-to-date ones
// round-robin, so every member of a quorum computes the same plan from its `members`.
std::vector<std::optional<int>> heal_sources(const std::vector<QuorumMember>& members);
// Every field checked; an error names the field.
Result<QuorumAssignment> quorum_assignment_from_json(const Json& j);

// A replica's ask for the next step's quorum, with the settings of the job's quorum (each
// replica of a job gives the same). One encoding, for ctrund's `quorum` op and its client.
struct QuorumRequest {
  QuorumMember member;
  QuorumConfig config;
  // The replica's communicator failed: the next quorum gets a new id (and store prefix) even if
  // its membership is unchanged, so every member builds a new one.
  bool rebuild = false;
  // Not an ask: the replica finished the training at member.step and leaves the quorum.
  bool finished = false;
};
Json to_json(const QuorumRequest& r);
Result<QuorumRequest> quorum_request_from_json(const Json& j);

}  // namespace ctrun::rendezvous
