// What a quorum means for the workers in it (FaultTolerance): who trains the step, with which
// rank, at which step, and who heals from whom. Pure: every member computes the same plan from
// the same assignment.
//
// Without shard groups (group size 1) every member is a replica of its own: all of them train,
// at the quorum's max_step, and members behind it heal from the up-to-date ones round-robin.
//
// With shard groups of S workers (HSDP: a replica's training state is sharded among S workers,
// the quorum replicates it across groups), a worker is slot `index` of group `group`, read from
// its replica id "<node>/<local rank>": group "<node>/<local rank / S>", index local rank % S.
// Only whole groups train (a group missing a worker holds no copy of that worker's shard);
// the members of the others wait for their group to be whole again. The step trained from is
// the highest step at which every shard index is held by some training member, so that a group
// whose members committed different steps (a failure during the commit vote) is brought back
// to one consistent state instead of mixing shards of two steps; members not at it heal from a
// member with the same index that is. When no step has every shard, a shard's state is lost
// with the workers that held it: the plan says so, and the job must resume from a checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/quorum.h"

namespace ctrun::worker {

// A worker's place in its shard group.
struct ShardSlot {
  std::string group;
  int index = 0;
};
// Reads "<node>/<local rank>"; an error names the replica id and what is wrong with it.
rendezvous::Result<ShardSlot> shard_slot(const std::string& replica_id, int group_size);

struct QuorumPlan {
  int group_size = 1;
  // The members that train, in training-rank order: training rank r is members[trainers[r]].
  // Group g (in the order of the groups' names) holds ranks g * group_size ... + group_size - 1,
  // its worker with index i at rank g * group_size + i.
  std::vector<int> trainers;
  std::vector<std::string> groups;  // the training groups' names, by group number
  std::int64_t step = 0;            // every trainer's committed step once healed
  // By training rank: the training rank it takes its state from, or nullopt (it holds `step`).
  std::vector<std::optional<int>> heal_from;
  // Not empty: no step has every shard among the trainers; why, in one line.
  std::string lost;

  // This member's training rank, or nullopt when it does not train this step.
  std::optional<int> rank_of(int member) const;
  int replicas() const { return static_cast<int>(groups.size()); }
  bool heals() const;
};

// `members` as in a QuorumAssignment (by replica id). An error when a replica id does not name
// a slot (group size above 1).
rendezvous::Result<QuorumPlan> plan_quorum(const std::vector<rendezvous::QuorumMember>& members,
                                           int group_size);

}  // namespace ctrun::worker
