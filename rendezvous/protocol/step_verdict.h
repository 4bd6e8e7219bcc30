// What straggler detection's parties say to each other through the job's store (the keys:
// step_keys.h): each node's step rates, and the job's verdict that node 0's agent sets, which
// every agent, `ctrun status` and ctrund's metrics read. One definition of each, decoded
// leniently in type (a value of the wrong type is an error, never an exception): ctrund reads
// what any client of the job wrote. Private to the tree.
#pragma once

#include <cstdint>
#include <optional>
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
  // Where the worker measures its waits for its peers in collectives: its own time per step
  // (the step less the wait) and the wait; and where the OS was read, what its own time went to
  // ("its own compute", "waiting for input", "not running: stopped", ...).
  std::optional<double> own_seconds_per_step{};
  std::optional<double> wait_seconds_per_step{};
  std::string kind{};
  std::optional<double> cpu_seconds_per_step{};  // its CPU time a step, where the OS was read
  // What the verdict judges: the rank's own time where measured, else its step time (in a job
  // whose ranks do not wait for each other the two are the same).
  double pace() const { return own_seconds_per_step.value_or(seconds_per_step); }
};

// One node's rates, as its agent publishes them under the round's store prefix:
// {"node", "host", "ranks": [{"rank", "step", "seconds_per_step", "steps", ...}]}.
Json node_rates_json(int node, const std::string& host, const std::vector<RankRate>& ranks);
Result<std::vector<RankRate>> node_rates_from_json(const Json& j);

struct StepVerdict {
  int round = 0;
  double factor = 0;
  double median = 0;                 // seconds per step, over every rank with a rate
  double median_pace = 0;            // the ranks' paces' median (the lower of two middle ones)
  std::vector<RankRate> ranks;       // by rank
  std::vector<int> stragglers;       // ranks whose pace is `factor` x the median pace, sorted
  std::vector<int> straggler_nodes;  // nodes of more than one rank whose every rank straggles
  // How much slower than the median pace `rank`'s is (0 for a rank without a rate).
  double slowdown(int rank) const;
  // How long `rank` holds every step of the others: its pace less the median pace (0 if less).
  double holds(int rank) const;
  const RankRate* find(int rank) const;
};

// {"round", "factor", "median_seconds_per_step", "median_own_seconds_per_step", "stragglers",
// "straggler_nodes", "ranks": [{..., "slowdown", "holds_seconds", "straggler"}]}; decoded, its
// ranks are sorted by rank.
Json step_verdict_json(const StepVerdict& verdict);
Result<StepVerdict> step_verdict_from_json(const Json& j);

}  // namespace ctrun::rendezvous
