// `ctrun status`: what a rendezvous answers about its jobs, shown as a table for people or as
// JSON for scripts. Pure: the answers come in as JSON, the text goes out as a string.
#pragma once

#include <cstddef>
#include <string>

#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

// One job in detail: the daemon's `status` answer plus the restart budget read from the job's
// store (-1 when no agent has said it) and the last fault injected on purpose (null: none).
struct JobStatus {
  rendezvous::Json status;
  long long max_restarts = -1;
  rendezvous::Json last_fault;
  // The job's step rates and stragglers as node 0's agent last judged them (the value of
  // kStragglersKey, stragglers.h); null: none.
  rendezvous::Json steps;
};

// {"job", "state", "round", "formed", "min_nodes", "max_nodes", "restarts", "max_restarts",
//  "restarts_left", "faults_injected", "last_fault", "connections", "keys", "end_reason",
//  "nodes": [{"node", "host", "group_rank", "local_world_size", "place", "succeeded",
//  "last_heartbeat_age_s"}], "steps": {"round", "median_seconds_per_step", "factor",
//  "stragglers", "straggler_nodes", "ranks": [{"rank", "node", "host", "step",
//  "seconds_per_step", "steps", "slowdown", "straggler"}]} or null}
// The table lists every rank's step rate up to kStepRowsShown ranks, then only the stragglers.
inline constexpr std::size_t kStepRowsShown = 64;
rendezvous::Json job_status_json(const JobStatus& job);
std::string job_status_table(const JobStatus& job);

// The daemon's `jobs` answer: {"jobs": [...]} as JSON, or one line per job.
rendezvous::Json jobs_json(const rendezvous::Json& jobs_answer);
std::string jobs_table(const rendezvous::Json& jobs_answer);

}  // namespace ctrun::launcher
