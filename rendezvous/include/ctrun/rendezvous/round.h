// What the rendezvous' parties say to each other about a round, whatever carries it (ctrund's
// frames, etcd's keys): a node's join request, its assignment when the round forms, the settings
// of the rendezvous, the job's state, and the restart counter kept in the job's store.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

// Keys the agents keep in their job's store: the restarts the job has used (each agent adds one
// per restart it takes) and the budget (--max_restarts, set by every agent alike).
inline constexpr const char* kRestartsKey = "ctrun/restarts";
inline constexpr const char* kMaxRestartsKey = "ctrun/max_restarts";
// A counter's value as the stores keep it (decimal text, as c10d's add writes it); `otherwise`
// when the text is not a number.
long long counter_value(const std::string& text, long long otherwise);

// Defaults are torchrun's --rdzv_conf defaults.
struct RendezvousConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  Duration join_timeout = std::chrono::seconds(600);
  Duration last_call_timeout = std::chrono::seconds(30);
  // How long an ended job (and its store) stays readable after its last node leaves.
  Duration close_timeout = std::chrono::seconds(30);
  Duration keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_attempt = 3;
};
Status validate(const RendezvousConfig& config);

struct NodeInfo {
  std::string node_id;  // unique per agent process
  std::string host;     // where this node's workers are reached (MASTER_ADDR if rank 0)
  int local_world_size = 1;
  int master_port = 0;      // a free port on `host`, offered for MASTER_PORT
  int requested_rank = -1;  // a static --node_rank, or -1 for any
};

// What one node learns when a round forms. The roster is not in it (it would make every answer
// O(nodes) long); `status` shows it.
struct RoundAssignment {
  int round = 0;
  int group_rank = 0;
  int group_world_size = 0;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
  std::string store_prefix;  // per-round key prefix so a new round never sees old keys
  // The job's restarts when the round formed, the same for every member (ctrund fills it in
  // from the job's counter, the etcd backend in the write that forms the round); -1: not known.
  int restart_count = -1;
};
// A node's request to join: who it is and the rendezvous settings it asks for. ctrund's join op
// and the etcd backend's join requests carry it alike: one set of fields, one set of bounds.
struct JoinRequest {
  NodeInfo node;
  RendezvousConfig config;
};
Json to_json(const JoinRequest& r);
// Every field checked for type and bounds (which keep the narrowing to int exact and rank sums
// within int); an error names the field. validate(config) is the caller's: it judges meaning.
Result<JoinRequest> join_request_from_json(const Json& j);

// "rdzv/<generation>/<round>/": where a round's workers keep their keys in the job's store.
std::string round_store_prefix(int generation, int round);
Json to_json(const RoundAssignment& a);
Result<RoundAssignment> round_assignment_from_json(const Json& j);

enum class JobState { kRunning, kSucceeded, kFailed, kClosed };
std::string_view job_state_name(JobState state);

}  // namespace ctrun::rendezvous
