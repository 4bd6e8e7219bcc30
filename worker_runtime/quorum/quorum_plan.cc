#include "worker_runtime/quorum/quorum_plan.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

namespace ctrun::worker {

using rendezvous::Error;
using rendezvous::ErrorCode;
using rendezvous::QuorumMember;
using rendezvous::Result;

Result<ShardSlot> shard_slot(const std::string& replica_id, int group_size) {
  if (group_size < 1) {
    return Error{ErrorCode::kBadRequest,
                 "shard group size " + std::to_string(group_size) + ": expected at least 1"};
  }
  if (group_size == 1) return ShardSlot{replica_id, 0};
  const auto slash = replica_id.rfind('/');
  int local_rank = -1;
  if (slash != std::string::npos) {
    const char* begin = replica_id.data() + slash + 1;
    const char* end = replica_id.data() + replica_id.size();
    const auto [at, error] = std::from_chars(begin, end, local_rank);
    if (error != std::errc() || at != end || begin == end) local_rank = -1;
  }
  if (local_rank < 0) {
    return Error{ErrorCode::kBadRequest,
                 "replica id '" + replica_id +
                     "' does not end in '/<local rank>': shard groups need the agent's ids"};
  }
  return ShardSlot{replica_id.substr(0, slash + 1) + std::to_string(local_rank / group_size),
                   local_rank % group_size};
}

std::optional<int> QuorumPlan::rank_of(int member) const {
  const auto at = std::find(trainers.begin(), trainers.end(), member);
  if (at == trainers.end()) return std::nullopt;
  return static_cast<int>(at - trainers.begin());
}

bool QuorumPlan::heals() const {
  return std::any_of(heal_from.begin(), heal_from.end(), [](const auto& s) { return s; });
}

Result<QuorumPlan> plan_quorum(const std::vector<QuorumMember>& members, int group_size) {
  QuorumPlan plan;
  plan.group_size = group_size;
  // Each group's members by index; -1 where the quorum has none.
  std::map<std::string, std::vector<int>> by_group;
  for (std::size_t m = 0; m < members.size(); ++m) {
    auto slot = shard_slot(members[m].replica_id, group_size);
    if (!slot) return slot.error();
    auto& group = by_group[slot.value().group];
    group.resize(static_cast<std::size_t>(group_size), -1);
    int& place = group[static_cast<std::size_t>(slot.value().index)];
    if (place >= 0) {
      return Error{ErrorCode::kConflict,
                   "replicas '" + members[static_cast<std::size_t>(place)].replica_id + "' and '" +
                       members[m].replica_id + "' claim the same shard slot"};
    }
    place = static_cast<int>(m);
  }
  for (const auto& [name, group] : by_group) {
    if (std::find(group.begin(), group.end(), -1) != group.end()) continue;  // not whole
    plan.groups.push_back(name);
    plan.trainers.insert(plan.trainers.end(), group.begin(), group.end());
  }
  plan.heal_from.assign(plan.trainers.size(), std::nullopt);
  if (plan.trainers.empty()) return plan;

  auto step_of = [&](int rank) {
    return members[static_cast<std::size_t>(plan.trainers[rank])].step;
  };
  const int ranks = static_cast<int>(plan.trainers.size());
  std::set<std::int64_t, std::greater<>> steps;
  for (int r = 0; r < ranks; ++r) steps.insert(step_of(r));
  if (*steps.begin() == 0) {
    // Nobody committed: everyone takes the first group's state, so that workers that
    // initialised differently start equal.
    for (int r = group_size; r < ranks; ++r) plan.heal_from[r] = r % group_size;
    return plan;
  }
  // A worker at step 0 holds nothing once others committed (it is new, or sat out).
  steps.erase(0);
  for (const std::int64_t step : steps) {
    // Holders of each index at `step`, in rank order.
    std::vector<std::vector<int>> holders(static_cast<std::size_t>(group_size));
    for (int r = 0; r < ranks; ++r) {
      if (step_of(r) == step) holders[static_cast<std::size_t>(r % group_size)].push_back(r);
    }
    if (std::any_of(holders.begin(), holders.end(), [](const auto& h) { return h.empty(); })) {
      continue;
    }
    plan.step = step;
    std::vector<std::size_t> next(static_cast<std::size_t>(group_size), 0);
    for (int r = 0; r < ranks; ++r) {
      if (step_of(r) == step) continue;
      const auto& h = holders[static_cast<std::size_t>(r % group_size)];
      plan.heal_from[r] = h[next[static_cast<std::size_t>(r % group_size)]++ % h.size()];
    }
    return plan;
  }
  const std::int64_t top = *steps.begin();
  for (int i = 0; i < group_size; ++i) {
    bool held = false;
    for (int r = i; r < ranks; r += group_size) held = held || step_of(r) == top;
    if (!held) {
      plan.lost = "the state of shard " + std::to_string(i) + " at step " + std::to_string(top) +
                  " is lost with the workers that held it (no step has every shard among the "
                  "whole groups): resume from a checkpoint";
      break;
    }
  }
  return plan;
}

}  // namespace ctrun::worker
