// Test helper: what a --fault_tolerant run promises, checked from the trainers' --consumed_log
// (one line per replica and committed step) and their console lines ("[<replica> pid N]
// training ...", "... parameters digest X ...").
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ctrun::testing {

struct Commit {
  std::uint64_t epoch = 0;
  long long unix_ms = 0;
  std::vector<std::uint64_t> indices;
};
// replica -> step -> what it committed.
using Commits = std::map<std::string, std::map<std::int64_t, Commit>>;

// The consumed log at `path`; a replica that committed one step twice fails the test.
Commits read_consumed(const std::string& path);

// The promises: every replica that committed a step committed the same samples for it; steps
// 1..N were committed with none missing; each of `epochs` epochs trained each of `samples`
// samples exactly once.
void check_commits(const Commits& commits, std::uint64_t samples, std::uint64_t epochs = 2);

// replica -> the pids its "training" lines (one per process started) and its digest line name.
struct ReplicaLines {
  std::vector<std::string> started_pids;
  std::string final_pid;
  std::string digest;
};
std::map<std::string, ReplicaLines> replica_lines(const std::string& log);

// `log` without the trainers' per-step loss lines: what a failed assertion prints, short enough
// to be read whole in a CI log.
std::string without_step_lines(const std::string& log);

// Each replica of `lines` ran in one process from start to end and ended with the same
// parameters as the others.
void check_kept_processes(const std::map<std::string, ReplicaLines>& lines);

// One node's replicas after its last worker (local rank `faulty`) failed once and was
// replaced, from the job's log `out`: `workers` replicas; the survivors ran in one process from
// start to end; the faulty one was started twice, and its replacement either ended with the
// others' parameters or, started after they finished, learned that nothing was left; every
// digest is the same.
void check_replaced_worker(const std::string& out, std::size_t workers, int faulty);

// A 2:3 job whose third node (log `out_c`) joined while the first two (`out_a`, `out_b`)
// trained: those two took it in without stopping their workers, the newcomer healed from a peer
// and committed steps too, every replica ran in one process to the same parameters, and the
// commits in `consumed` keep their promises for `samples` samples.
void check_node_joined(const std::string& out_a, const std::string& out_b, const std::string& out_c,
                       const std::string& consumed, std::uint64_t samples);

// A --fault_report of a --fault_tolerance=step job at `path`: it succeeded, no replaced worker
// redid a step, and every result (digest) is the same. Returns how many results it holds.
std::size_t check_fault_tolerant_report(const std::string& path);

// `mlp --fault_tolerant` for 2 epochs of `samples` (batch 32, seed 7), logging its commits to
// `consumed`, with the tests' timeouts: collective 1 s, heartbeat 0.5 s, join 3 s, quorum
// `quorum_timeout_ms`.
std::vector<std::string> ft_mlp_argv(const std::string& mlp_path, std::uint64_t samples,
                                     const std::string& consumed, long quorum_timeout_ms = 30000);

// `ctrun` for one node (one worker) of a multi-node --fault_tolerance=step job on the c10d
// rendezvous at `endpoint` under `rdzv_id` (`conf`: its --rdzv_conf, may be empty), no
// restarts, running `worker` (e.g. ft_mlp_argv's).
std::vector<std::string> ft_agent_argv(const std::string& ctrun_path, const std::string& nnodes,
                                       const std::string& endpoint, const std::string& rdzv_id,
                                       const std::string& conf,
                                       const std::vector<std::string>& worker);

// Wall-clock milliseconds since the Unix epoch, as the consumed log stamps its lines.
long long unix_ms_now();

// Lines in the consumed log so far: one per replica and committed step.
long lines_in(const std::string& path);
// Polls (bounded) until the consumed log at `path` has `lines` lines.
bool wait_for_lines(const std::string& path, long lines, std::chrono::seconds timeout);

}  // namespace ctrun::testing
