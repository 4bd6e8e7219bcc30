// The keys of ctrun's straggler detection in a job's store (docs/cluster.md): what the
// agents, `ctrun status` and ctrund's metrics say to each other. Private to the tree.
#pragma once

namespace ctrun::rendezvous {

// Each node's workers' step rates, under its round's store prefix + kStepRatesPrefix + its
// group rank: {"node", "host", "ranks": [{"rank", "step", "seconds_per_step", "steps"}]}.
inline constexpr const char* kStepRatesPrefix = "ctrun/steps/";
// The job's verdict, set by node 0's agent (not under a round's prefix: `ctrun status` and the
// metrics read it as it stands): {"round", "factor", "median_seconds_per_step", "stragglers":
// [rank], "straggler_nodes": [group rank], "ranks": [{"rank", "node", "host", "step",
// "seconds_per_step", "steps", "slowdown", "straggler"}]}.
inline constexpr const char* kStragglersKey = "ctrun/stragglers";

}  // namespace ctrun::rendezvous
