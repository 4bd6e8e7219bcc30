// Stragglers: the ranks of a job whose steps are slower than the job's median by a factor. The
// agents publish their workers' step rates (step_rates.h) to the job's store; the agent of node
// 0 reads them all and judges here; every agent reads the verdict and tells what changed since
// the last one (StragglerLog). Pure: JSON in, JSON and lines out.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

struct RankRate {
  int rank = 0;
  int node = 0;  // group rank
  std::string host;
  std::int64_t step = 0;
  double seconds_per_step = 0;
  std::int64_t steps = 0;  // how many steps the rate spans
};

// One node's rates, as its agent publishes them under the round's store prefix.
rendezvous::Json node_rates_json(int node, const std::string& host,
                                 const std::vector<RankRate>& ranks);
rendezvous::Result<std::vector<RankRate>> node_rates_from_json(const rendezvous::Json& j);

struct StepVerdict {
  int round = 0;
  double factor = 0;
  double median = 0;                 // seconds per step, over every rank with a rate
  std::vector<RankRate> ranks;       // by rank
  std::vector<int> stragglers;       // ranks at least `factor` x the median
  std::vector<int> straggler_nodes;  // nodes of more than one rank whose every rank straggles
  // How much slower than the median `rank` is (0 for a rank without a rate).
  double slowdown(int rank) const;
  const RankRate* find(int rank) const;
};

// The job's verdict from every node's rates. No median (and no straggler) below two ranks.
StepVerdict judge_steps(std::vector<RankRate> ranks, double factor, int round);

rendezvous::Json step_verdict_json(const StepVerdict& verdict);
rendezvous::Result<StepVerdict> step_verdict_from_json(const rendezvous::Json& j);

// What one agent says as verdicts come: a straggler once when it starts to straggle (a whole
// node once for its ranks), once more when it no longer does; a new round starts afresh.
class StragglerLog {
 public:
  struct Change {
    bool straggling = false;  // else: back to the job's pace
    std::optional<int> node;  // a whole node; else one rank
    std::vector<int> ranks;
    std::string line;
  };
  std::vector<Change> take(const StepVerdict& verdict);

 private:
  int round_ = -1;
  std::set<int> ranks_;  // named as stragglers, not yet back
  std::set<int> nodes_;
};

}  // namespace ctrun::launcher
