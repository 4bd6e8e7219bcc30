// A hang attributed across every rank of a job (docs/faults.md, "Hang reports"): each rank's
// stacks and last step, grouped by where the rank stands, so that the rank that did not reach
// the collective the others wait in is named. Pure: the agents take the stacks and read the
// NCCL Flight Recorder's dumps; this reads what they took.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

// Where a rank stands: the innermost frame that is not a wait of the runtime's own, and the
// innermost frame of the user's code that leads there (Python workers).
struct StackPlace {
  std::string function;  // "all_reduce", "slow_data" ("" when no stack was taken)
  std::string at;        // "distributed_c10d.py:1234"
  std::string from;      // "train.py:31": the user's frame, when `at` is inside a library
};

// faulthandler's text (`Thread 0x... (most recent call first):` and `  File "F", line N in
// FUNC` lines, every thread) read as the place of the main thread: the last one faulthandler
// lists. Nothing when the text holds no frame.
std::optional<StackPlace> python_place(const std::string& faulthandler_text);

// eu-stack's text read as the place of the process's first thread (its main one): the innermost
// frame that is not a wait in libc, the kernel's futex or poll, or a condition variable.
std::optional<StackPlace> native_place(const std::string& eu_stack_text);

// What one rank's agent took.
struct RankStacks {
  int rank = 0;
  int node = 0;  // the node's group rank
  std::string host;
  int pid = 0;
  std::optional<std::int64_t> step;  // the last step it reported
  bool hung = false;                 // its agent judged it hung (--worker_timeout)
  std::string python_stacks;         // faulthandler's text, every thread
  std::string native_stacks;         // eu-stack's text
  std::string error;                 // why a stack is missing
};

// Where a rank stands: its Python stacks' place, else its native stacks'.
StackPlace stack_place(const RankStacks& r);

rendezvous::Json rank_stacks_json(const RankStacks& r);
std::optional<RankStacks> rank_stacks_from_json(const rendezvous::Json& j);

// One NCCL Flight Recorder dump, as the reader (ctrun_worker.py's `fr_summary`) says it: per
// process group, the last collective this rank recorded.
struct FlightRecord {
  int rank = 0;
  struct Last {
    std::string group;  // the process group's id
    std::int64_t seq = 0;
    std::string op;     // "nccl:all_reduce"
    std::string state;  // "scheduled", "started", "completed"
  };
  std::vector<Last> last;
};

rendezvous::Json flight_record_json(const FlightRecord& f);
std::optional<FlightRecord> flight_record_from_json(const rendezvous::Json& j);

// What the nodes answered to one request (dump_keys.h: their group rank -> their answer), out
// of the round's `nodes`: every rank's stacks by rank, the Flight Recorder's records, and the
// nodes that did not answer.
struct JobStacks {
  std::vector<RankStacks> ranks;
  std::vector<FlightRecord> flight;
  std::vector<int> missing_nodes;
};
// The answers to one dump request, node by node as they come (the text each node stored); an
// answer that is not a JSON object counts as missing. With `nodes_from_node0` (`ctrun status
// --dump`, which knows no round) node 0's answer says how many nodes to wait for, bounded.
class DumpAnswers {
 public:
  DumpAnswers(int nodes, bool nodes_from_node0)
      : nodes_(nodes), nodes_from_node0_(nodes_from_node0) {}
  void add(int node, const std::string& text);
  int nodes() const { return nodes_; }
  JobStacks job() const;

 private:
  std::map<int, rendezvous::Json> answers_;
  int nodes_;
  bool nodes_from_node0_;
};

// The report of a whole job.
struct HangReport {
  struct Group {
    std::vector<int> ranks;
    std::optional<std::int64_t> step;
    StackPlace place;
  };
  std::vector<Group> groups;        // the largest first
  std::vector<int> suspects;        // the ranks that stand apart from where the others wait
  std::vector<int> missing_nodes;   // nodes that sent nothing in time
  std::vector<std::string> flight;  // what the Flight Recorder's dumps say, a line each
};

// Groups the ranks by (step, place). Suspects: with more than one group, the ranks outside the
// largest one, and among them those behind the largest group's step first; a rank at an earlier
// step than every other is a suspect even alone.
HangReport build_hang_report(const std::vector<RankStacks>& ranks, std::vector<int> missing_nodes,
                             const std::vector<FlightRecord>& flight);

// "ranks 0-6 at step 118 in all_reduce (distributed_c10d.py:1234, from train.py:31); rank 7 at
// step 117 in slow_data (train.py:20)", then "rank 7 stands apart: ..." lines.
std::vector<std::string> hang_report_lines(const HangReport& report);
rendezvous::Json hang_report_json(const HangReport& report, const std::vector<RankStacks>& ranks);

// The Flight Recorder's verdict: for each process group, the last collective any rank
// entered, the ranks that did not enter it, and those still in it.
std::vector<std::string> flight_record_lines(const std::vector<FlightRecord>& records);

}  // namespace ctrun::launcher
