// The rendezvous of one job: which nodes form each round, their ranks, when a round reopens,
// and how the job ends. A plain class: no sockets, time only through the injected Clock, and
// every outcome returned as Notices for the caller to deliver.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/round.h"
#include "rendezvous/base/event_log.h"

namespace ctrun::rendezvous {

struct Notice {
  enum class Kind {
    kRoundFormed,    // answer to a join: `assignment`
    kJoinFailed,     // answer to a join: `error`
    kRoundReopened,  // to a running member: stop workers and join round `round`
    kJobEnded,       // to a member: the job is over with `state`
  };
  Kind kind = Kind::kJobEnded;
  std::string node_id{};
  RoundAssignment assignment{};
  Error error{ErrorCode::kInternal, ""};
  int round = 0;
  std::string reason{};
  JobState state = JobState::kRunning;
};

class Rendezvous {
 public:
  using Logger = std::function<void(const std::string&)>;

  // `generation` tells apart successive jobs under one id: it is part of every store prefix.
  Rendezvous(std::string job_id, RendezvousConfig config, const Clock& clock, Logger log = {},
             int generation = 0);

  // Enters the round being gathered, or waits for the next one when the formed round is full.
  // The answer comes later as a kRoundFormed or kJoinFailed notice for the node; a refusal is
  // returned at once. A member of the formed round that joins again asks for a new round.
  Result<std::vector<Notice>> join(const NodeInfo& node);
  // A node that left on purpose, or whose connection or keep-alives were lost.
  std::vector<Notice> remove_node(const std::string& node_id, const std::string& reason);
  void keep_alive(const std::string& node_id);
  // The final result of a member's workers: failed ends the job; the job succeeds when every
  // member of the formed round has succeeded.
  Result<std::vector<Notice>> report(const std::string& node_id, bool succeeded,
                                     const std::string& message);
  std::vector<Notice> close(const std::string& reason);
  // Applies deadlines: keep-alives, join timeouts, the last call.
  std::vector<Notice> tick();
  // When tick() next has something to do, keep-alives aside; nullopt when nothing waits.
  std::optional<TimePoint> next_deadline() const;

  // Structured events (join, round_open, round, node_lost, node_succeeded, job_end), each with
  // the job's id, for ctrund's --event_log.
  void set_event_sink(EventSink sink) { events_ = std::move(sink); }

  const std::string& job_id() const { return job_id_; }
  const RendezvousConfig& config() const { return config_; }
  JobState state() const { return state_; }
  bool formed() const { return formed_; }
  int round() const { return round_; }  // the formed round, or the one being gathered
  int nodes_waiting() const;            // joined but not in the formed round
  bool has_node(const std::string& node_id) const { return nodes_.count(node_id) != 0; }
  // Joined and waiting for a round to form (not a member, nor told to join again).
  bool is_joining(const std::string& node_id) const;
  std::size_t num_nodes() const { return nodes_.size(); }
  // Workers of every node it knows (members and those waiting to join): the most ranks the job
  // can have in its next round, which is what the job's worker store must serve.
  std::size_t ranks() const;
  std::vector<std::string> node_ids() const;
  Json describe() const;
  // What a member of the formed round was told when it formed; nullopt for anyone else. (The
  // etcd backend has no daemon to deliver notices: each agent reads its own from the state.)
  std::optional<RoundAssignment> assignment(const std::string& node_id) const;
  // The job's restart counter as the formed round formed, for every member's assignment. Set by
  // the etcd backend in the very write that forms the round (read and written under one
  // compare-and-swap), so a peer's restart for a failure in that round is never counted in it.
  // -1 until set; a new round starts at -1 again.
  void set_round_restart_count(int count);
  bool round_restart_count_unset() const { return formed_ && round_restart_count_ < 0; }
  // What assignment(node_id)->restart_count says, for a member of the formed round (nullopt
  // for anyone else), without building every member's assignment.
  std::optional<int> member_restart_count(const std::string& node_id) const;
  const std::string& open_reason() const { return open_reason_; }  // why round() opened
  const std::string& end_reason() const { return end_reason_; }
  // Why `node_id` was removed, while it is among the last few removed.
  std::optional<std::string> departure(const std::string& node_id) const;

  // Durable state (ctrund --state_dir, the etcd backend's key). revision() changes whenever what
  // save() returns would (keep-alives aside), so the caller records the state only when it
  // moved. Timers: kFresh starts every timer afresh (ctrund after a restart: each restored node
  // gets a full keep-alive window to come back); kCarried goes on with the last call and join
  // deadlines where the writer left them, by wall clock (agents that take turns with one state).
  enum class Timers { kFresh, kCarried };
  std::uint64_t revision() const { return revision_; }
  Json save() const;
  static Result<std::unique_ptr<Rendezvous>> restore(const Json& saved, const Clock& clock,
                                                     Logger log = {},
                                                     Timers timers = Timers::kFresh);
  int generation() const { return generation_; }

 private:
  // kNew only until join() places the node; counted like the others so counts stay exact.
  // kDone: a member that succeeded before its round reopened; it waits for the job's end.
  enum class Place { kPending, kWaiting, kMember, kStale, kNew, kDone };
  struct Node {
    NodeInfo info;
    Place place = Place::kNew;
    TimePoint joined_at;
    TimePoint last_seen;
    std::uint64_t join_seq = 0;
    bool succeeded = false;
  };

  void log(const std::string& line) const;
  void emit(const std::string& event, Json fields) const;
  void reopen(const std::string& reason, const std::string& except, std::vector<Notice>& out);
  void maybe_form(std::vector<Notice>& out);
  void form(std::vector<Notice>& out);
  // Each member's assignment, by group rank, for the formed round.
  std::vector<RoundAssignment> assignments() const;
  void end(JobState state, const std::string& reason, std::vector<Notice>& out);
  int count(Place place) const { return place_counts_[static_cast<int>(place)]; }
  void place(Node& node, Place where);

  std::string job_id_;
  RendezvousConfig config_;
  int generation_;
  const Clock& clock_;
  Logger log_;
  EventSink events_;
  std::map<std::string, Node> nodes_;
  std::array<int, 6> place_counts_{};     // nodes in each Place
  std::map<std::string, int> last_rank_;  // group ranks of the last formed round
  std::vector<std::string> members_;      // the formed round, by group rank
  int round_ = 0;
  bool formed_ = false;
  int round_restart_count_ = -1;
  std::optional<TimePoint> last_call_deadline_;
  JobState state_ = JobState::kRunning;
  std::string open_reason_;
  std::string end_reason_;
  std::vector<std::pair<std::string, std::string>> departures_;  // (node, reason), oldest first
  std::uint64_t next_join_seq_ = 0;
  std::uint64_t revision_ = 0;
};

}  // namespace ctrun::rendezvous
