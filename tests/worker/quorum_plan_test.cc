// Who trains and who heals from whom in a quorum, with and without shard groups (HSDP).
#include "worker_runtime/quorum/quorum_plan.h"

#include "catch.h"

using ctrun::rendezvous::heal_sources;
using ctrun::rendezvous::QuorumMember;
using ctrun::worker::plan_quorum;
using ctrun::worker::QuorumPlan;
using ctrun::worker::shard_slot;

namespace {

std::vector<QuorumMember> members(std::vector<std::pair<std::string, std::int64_t>> list) {
  std::vector<QuorumMember> out;
  for (auto& [id, step] : list) out.push_back(QuorumMember{id, step, ""});
  return out;
}

QuorumPlan plan(const std::vector<QuorumMember>& m, int group_size) {
  auto p = plan_quorum(m, group_size);
  REQUIRE(p.ok());
  return p.value();
}

}  // namespace

TEST_CASE("quorum plan: a worker's shard slot is read from the agent's replica id") {
  auto slot = shard_slot("node-a/5", 2);
  REQUIRE(slot.ok());
  CHECK(slot.value().group == "node-a/2");
  CHECK(slot.value().index == 1);
  slot = shard_slot("anything at all", 1);
  REQUIRE(slot.ok());
  CHECK(slot.value().group == "anything at all");
  for (const char* bad : {"node", "node/", "node/x", "node/-1", "node/1x"}) {
    INFO(bad);
    auto refused = shard_slot(bad, 2);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message ==
          "replica id '" + std::string(bad) +
              "' does not end in '/<local rank>': shard groups need the agent's ids");
  }
  CHECK_FALSE(shard_slot("n/0", 0).ok());
}

TEST_CASE("quorum plan: without shard groups every member trains and heals as the quorum says") {
  const auto m = members({{"a/0", 7}, {"b/0", 3}, {"c/0", 7}, {"d/0", 0}, {"e/0", 7}});
  const auto p = plan(m, 1);
  CHECK(p.trainers == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(p.step == 7);
  CHECK(p.lost.empty());
  CHECK(p.heal_from == heal_sources(m));  // the rule every member of a DDP quorum uses
  CHECK(p.rank_of(3) == 3);
  // Before anyone committed, everyone takes rank 0's state.
  const auto fresh = plan(members({{"a/0", 0}, {"b/0", 0}, {"c/0", 0}}), 1);
  CHECK(fresh.heal_from == std::vector<std::optional<int>>{std::nullopt, 0, 0});
}

TEST_CASE("quorum plan: only whole groups train, ranked group by group") {
  // Group n1/0 lost its worker with local rank 1: its other worker waits.
  const auto m = members({{"n0/0", 9}, {"n0/1", 9}, {"n1/0", 9}, {"n2/0", 9}, {"n2/1", 9}});
  const auto p = plan(m, 2);
  CHECK(p.groups == std::vector<std::string>{"n0/0", "n2/0"});
  CHECK(p.trainers == std::vector<int>{0, 1, 3, 4});
  CHECK(p.replicas() == 2);
  CHECK_FALSE(p.rank_of(2).has_value());
  CHECK(p.rank_of(4) == 3);
  CHECK_FALSE(p.heals());
  CHECK(p.step == 9);
  // Four local ranks in groups of two: two groups per node.
  const auto four = plan(members({{"n/0", 1}, {"n/1", 1}, {"n/2", 1}, {"n/3", 1}}), 2);
  CHECK(four.groups == std::vector<std::string>{"n/0", "n/1"});
  // No whole group: nobody trains, and nothing is lost yet.
  const auto none = plan(members({{"n0/0", 4}, {"n1/1", 4}}), 2);
  CHECK(none.trainers.empty());
  CHECK(none.lost.empty());
}

TEST_CASE("quorum plan: a group made whole again heals each worker from its shard's holder") {
  // n1/1 was replaced (step 0), and n1/0 sat out meanwhile (asks with 0).
  const auto p = plan(members({{"n0/0", 12}, {"n0/1", 12}, {"n1/0", 0}, {"n1/1", 0}}), 2);
  CHECK(p.step == 12);
  CHECK(p.heal_from == std::vector<std::optional<int>>{std::nullopt, std::nullopt, 0, 1});
  // Two up-to-date groups share the healing of two behind ones, index by index.
  const auto many = plan(members({{"a/0", 5},
                                  {"a/1", 5},
                                  {"b/0", 5},
                                  {"b/1", 5},
                                  {"c/0", 2},
                                  {"c/1", 2},
                                  {"d/0", 0},
                                  {"d/1", 0}}),
                         2);
  CHECK(many.heal_from == std::vector<std::optional<int>>{std::nullopt, std::nullopt, std::nullopt,
                                                          std::nullopt, 0, 1, 2, 3});
  // Before anyone committed: every group takes the first group's state.
  const auto fresh = plan(members({{"a/0", 0}, {"a/1", 0}, {"b/0", 0}, {"b/1", 0}}), 2);
  CHECK(fresh.heal_from == std::vector<std::optional<int>>{std::nullopt, std::nullopt, 0, 1});
}

TEST_CASE("quorum plan: a group whose workers committed different steps is made consistent") {
  // a/0 committed step 8, a/1 did not (a failure during the vote); b holds step 8 whole.
  auto p = plan(members({{"a/0", 8}, {"a/1", 7}, {"b/0", 8}, {"b/1", 8}}), 2);
  CHECK(p.step == 8);
  CHECK(p.heal_from ==
        std::vector<std::optional<int>>{std::nullopt, 3, std::nullopt, std::nullopt});
  // Nobody holds shard 1 at step 8, every shard is held at 7: back to 7, not a mix of both.
  p = plan(members({{"a/0", 8}, {"a/1", 7}, {"b/0", 7}, {"b/1", 7}}), 2);
  CHECK(p.step == 7);
  CHECK(p.heal_from ==
        std::vector<std::optional<int>>{2, std::nullopt, std::nullopt, std::nullopt});
  CHECK(p.lost.empty());
  // One group alone with its workers at different steps: no copy of the other state anywhere.
  p = plan(members({{"a/0", 8}, {"a/1", 7}, {"b/0", 0}, {"b/1", 0}}), 2);
  CHECK(p.lost ==
        "the state of shard 1 at step 8 is lost with the workers that held it (no step has "
        "every shard among the whole groups): resume from a checkpoint");
}

TEST_CASE("quorum plan: two members in one slot are refused") {
  auto refused = plan_quorum(members({{"n/0", 1}, {"n/2", 1}}), 2);
  CHECK(refused.ok());  // n/0 is group n/0 index 0, n/2 is group n/1 index 0
  refused = plan_quorum(members({{"n/0", 1}, {"x/y/0", 1}, {"n/1", 1}}), 2);
  CHECK(refused.ok());
  refused = plan_quorum(members({{"n/1", 1}, {"n/01", 1}}), 2);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "replicas 'n/1' and 'n/01' claim the same shard slot");
}
