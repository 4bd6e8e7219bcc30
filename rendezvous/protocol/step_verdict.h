// What straggler detection's parties say to each other through the job's store (the keys:
// step_keys.h): each node's step rates, and the job's verdict that node 0's agent sets, which
// every agent, `ctrun status` and ctrund's metrics read. One definition of each, decoded
// leniently in type (a value of the wrong type is an error, never an exception): ctrund reads
// what any client of the job wrote. Private to the tree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

struct RankRate {
  int rank = 0;
  int node = 0;  // group rank
  std::string host;
  std::int64_t step = 0;
  double seconds_per_step = 0;
  std::int64_t steps = 0;  // how many steps the rate spans
};

// One node's rates, as its agent publishes them under the round's store prefix:
// {"node", "host", "ranks": [{"rank", "step", "seconds_per_step", "steps", ...}]}.
Json node_rates_json(int node, const std::string& host, const std::vector<RankRate>& ranks);
Result<std::vector<RankRate>> node_rates_from_json(const Json& j);

struct StepVerdict {
  int round = 0;
  double factor = 0;
  double median = 0;                 // seconds per step, over every rank with a rate
  std::vector<RankRate> ranks;       // by rank
  std::vector<int> stragglers;       // ranks at least `factor` x the median, sorted
  std::vector<int> straggler_nodes;  // nodes of more than one rank whose every rank straggles
  // How much slower than the median `rank` is (0 for a rank without a rate).
  double slowdown(int rank) const;
  const RankRate* find(int rank) const;
};

// {"round", "factor", "median_seconds_per_step", "stragglers", "straggler_nodes", "ranks":
// [{..., "slowdown", "straggler"}]}; decoded, its ranks are sorted by rank.
Json step_verdict_json(const StepVerdict& verdict);
Result<StepVerdict> step_verdict_from_json(const Json& j);

}  // namespace ctrun::rendezvous
