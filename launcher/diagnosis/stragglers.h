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
#include "rendezvous/protocol/step_verdict.h"

namespace ctrun::launcher {

// The rates and the verdict as the job's store carries them (one definition, in the protocol).
using rendezvous::node_rates_from_json;
using rendezvous::node_rates_json;
using rendezvous::RankRate;
using rendezvous::step_verdict_from_json;
using rendezvous::step_verdict_json;
using rendezvous::StepVerdict;

// The job's verdict from every node's rates. No median (and no straggler) below two ranks.
StepVerdict judge_steps(std::vector<RankRate> ranks, double factor, int round);

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
