#include "rendezvous/core/rendezvous.h"

#include <algorithm>
#include <tuple>

#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous {

Rendezvous::Rendezvous(std::string job_id, RendezvousConfig config, const Clock& clock, Logger log,
                       int generation)
    : job_id_(std::move(job_id)),
      config_(config),
      generation_(generation),
      clock_(clock),
      log_(std::move(log)) {}

void Rendezvous::log(const std::string& line) const {
  if (log_) log_("job '" + job_id_ + "': " + line);
}

void Rendezvous::emit(const std::string& event, Json fields) const {
  if (!events_) return;
  fields["job"] = job_id_;
  events_(event, std::move(fields));
}

void Rendezvous::place(Node& node, Place where) {
  ++revision_;
  --place_counts_[static_cast<int>(node.place)];
  ++place_counts_[static_cast<int>(where)];
  node.place = where;
}

int Rendezvous::nodes_waiting() const {
  return formed_ ? count(Place::kWaiting) : count(Place::kPending) + count(Place::kWaiting);
}

Result<std::vector<Notice>> Rendezvous::join(const NodeInfo& info) {
  if (state_ != JobState::kRunning) {
    return Error{ErrorCode::kClosed, "job '" + job_id_ + "' has ended (" +
                                         std::string(job_state_name(state_)) + ": " + end_reason_ +
                                         ")"};
  }
  if (info.node_id.empty()) return Error{ErrorCode::kBadRequest, "join needs a node id"};
  if (info.local_world_size < 1) {
    return Error{ErrorCode::kBadRequest, "local_world_size must be at least 1"};
  }
  if (info.master_port < 0 || info.master_port > 65535) {
    return Error{ErrorCode::kBadRequest, "master_port must be in 0..65535"};
  }
  if (info.requested_rank >= config_.max_nodes) {
    return Error{ErrorCode::kConflict, "node rank " + std::to_string(info.requested_rank) +
                                           " is not below max_nodes " +
                                           std::to_string(config_.max_nodes)};
  }
  if (info.requested_rank >= 0) {
    for (const auto& [id, n] : nodes_) {
      if (id != info.node_id && n.info.requested_rank == info.requested_rank) {
        return Error{ErrorCode::kConflict, "node rank " + std::to_string(info.requested_rank) +
                                               " is already taken by node '" + id + "'"};
      }
    }
  }

  std::vector<Notice> out;
  const TimePoint now = clock_.now();
  auto it = nodes_.find(info.node_id);
  if (it != nodes_.end() && it->second.place == Place::kMember && it->second.succeeded) {
    return Error{ErrorCode::kConflict,
                 "node '" + info.node_id + "' already reported success in this job"};
  }
  const bool restarting_member = it != nodes_.end() && it->second.place == Place::kMember;
  const bool newcomer = it == nodes_.end();
  if (restarting_member) {
    reopen("node '" + info.node_id + "' asked for a new round", info.node_id, out);
  }
  auto [slot, inserted] = nodes_.try_emplace(info.node_id);
  Node& node = slot->second;
  if (inserted) ++place_counts_[static_cast<int>(Place::kNew)];
  const bool already_joined =
      !newcomer && (node.place == Place::kPending || node.place == Place::kWaiting);
  node.info = info;
  node.last_seen = now;
  ++revision_;
  if (already_joined) return out;  // a repeated join keeps its place in line
  node.joined_at = now;
  node.join_seq = next_join_seq_++;
  node.succeeded = false;

  if (formed_) {
    if (static_cast<int>(members_.size()) < config_.max_nodes) {
      place(node, Place::kPending);
      reopen("new node '" + info.node_id + "' is waiting", info.node_id, out);
    } else {
      place(node, Place::kWaiting);
      log("node '" + info.node_id + "' waits: round " + std::to_string(round_) + " is full");
      emit("join", {{"node", info.node_id},
                    {"node_host", info.host},
                    {"local_world_size", info.local_world_size},
                    {"round", round_},
                    {"waiting", true}});
      return out;
    }
  } else {
    place(node, Place::kPending);
  }
  log("node '" + info.node_id + "' (" + info.host + ", " + std::to_string(info.local_world_size) +
      " workers) joined round " + std::to_string(round_) + " (" +
      std::to_string(count(Place::kPending)) + " of " + std::to_string(config_.min_nodes) + ".." +
      std::to_string(config_.max_nodes) + ")");
  emit("join", {{"node", info.node_id},
                {"node_host", info.host},
                {"local_world_size", info.local_world_size},
                {"round", round_},
                {"waiting", false}});
  maybe_form(out);
  return out;
}

void Rendezvous::reopen(const std::string& reason, const std::string& except,
                        std::vector<Notice>& out) {
  ++round_;
  ++revision_;
  formed_ = false;
  last_call_deadline_.reset();
  open_reason_ = reason;
  log("round " + std::to_string(round_) + " opens: " + reason);
  emit("round_open", {{"round", round_}, {"reason", reason}});
  for (const auto& id : members_) {
    Node& n = nodes_.at(id);
    if (n.succeeded) {  // finished: not expected back, but told when the job ends
      place(n, Place::kDone);
      continue;
    }
    place(n, Place::kStale);
    if (id != except) {
      out.push_back(Notice{
          .kind = Notice::Kind::kRoundReopened, .node_id = id, .round = round_, .reason = reason});
    }
  }
  members_.clear();
  if (count(Place::kWaiting) > 0) {
    for (auto& [id, n] : nodes_) {
      if (n.place == Place::kWaiting) place(n, Place::kPending);
    }
  }
}

void Rendezvous::maybe_form(std::vector<Notice>& out) {
  if (formed_ || state_ != JobState::kRunning) return;
  const int pending = count(Place::kPending);
  if (pending >= config_.max_nodes) return form(out);
  if (pending < config_.min_nodes) {
    last_call_deadline_.reset();
    return;
  }
  // Survivors of the last round were told to rejoin: wait for each of them until it rejoins or
  // is removed (leave, lost connection, missed keep-alives). Forming without them would make
  // every survivor that comes back a newcomer that reopens the round again.
  if (count(Place::kStale) > 0) return;
  // A reopened round need not wait for strangers once every survivor is back: newcomers that
  // show up later open another round themselves.
  auto survivor_pending = [this] {
    return std::any_of(nodes_.begin(), nodes_.end(), [this](const auto& kv) {
      return kv.second.place == Place::kPending && last_rank_.count(kv.first) != 0;
    });
  };
  const bool survivors_back = round_ > 0 && survivor_pending();
  if (survivors_back || config_.last_call_timeout == Duration::zero()) return form(out);
  if (!last_call_deadline_) {
    last_call_deadline_ = clock_.now() + config_.last_call_timeout;
    ++revision_;
  }
}

void Rendezvous::form(std::vector<Notice>& out) {
  std::vector<std::string> candidates;
  for (const auto& [id, n] : nodes_) {
    if (n.place == Place::kPending) candidates.push_back(id);
  }
  // Priority for a seat: a static rank, then survivors by their old rank, then join order.
  auto priority = [this](const std::string& id) {
    const Node& n = nodes_.at(id);
    auto last = last_rank_.find(id);
    return std::tuple(n.info.requested_rank >= 0 ? 0 : 1,
                      last == last_rank_.end() ? config_.max_nodes : last->second, n.join_seq);
  };
  std::sort(candidates.begin(), candidates.end(),
            [&](const auto& a, const auto& b) { return priority(a) < priority(b); });
  const std::size_t seats = std::min<std::size_t>(candidates.size(), config_.max_nodes);
  const int n = static_cast<int>(seats);
  std::vector<std::string> by_rank(seats);
  std::vector<bool> placed(seats, false);
  auto try_place = [&](std::size_t i, int rank) {
    if (placed[i] || rank < 0 || rank >= n || !by_rank[rank].empty()) return;
    by_rank[rank] = candidates[i];
    placed[i] = true;
  };
  for (std::size_t i = 0; i < seats; ++i)
    try_place(i, nodes_.at(candidates[i]).info.requested_rank);
  for (std::size_t i = 0; i < seats; ++i) {
    auto last = last_rank_.find(candidates[i]);
    if (last != last_rank_.end()) try_place(i, last->second);
  }
  int next_free = 0;
  for (std::size_t i = 0; i < seats; ++i) {
    while (next_free < n && !by_rank[next_free].empty()) ++next_free;
    try_place(i, next_free);
  }
  for (std::size_t i = seats; i < candidates.size(); ++i) {
    place(nodes_.at(candidates[i]), Place::kWaiting);
  }

  std::string roster;  // for the log: the first few ranks are enough to read
  for (int r = 0; r < n; ++r) {
    place(nodes_.at(by_rank[r]), Place::kMember);
    if (r < 8) roster += (r ? ", " : "") + by_rank[r] + "=" + std::to_string(r);
  }
  if (n > 8) roster += ", ...";
  members_ = by_rank;
  last_rank_.clear();
  formed_ = true;
  round_restart_count_ = -1;
  ++revision_;
  last_call_deadline_.reset();
  std::vector<RoundAssignment> told = assignments();
  const RoundAssignment& base = told.front();
  log("round " + std::to_string(round_) + " formed: " + std::to_string(n) + " nodes, world size " +
      std::to_string(base.world_size) + " [" + roster + "]");
  if (events_) {
    Json members = Json::array();
    for (int r = 0; r < n; ++r) {
      const NodeInfo& info = nodes_.at(by_rank[r]).info;
      members.push_back({{"node", info.node_id},
                         {"host", info.host},
                         {"group_rank", r},
                         {"local_world_size", info.local_world_size}});
    }
    emit("round", {{"round", round_},
                   {"nodes", n},
                   {"world_size", base.world_size},
                   {"master_addr", base.master_addr},
                   {"master_port", base.master_port},
                   {"members", std::move(members)}});
  }
  out.reserve(out.size() + seats);
  for (int r = 0; r < n; ++r) {
    last_rank_[by_rank[r]] = r;
    out.push_back(Notice{.kind = Notice::Kind::kRoundFormed,
                         .node_id = by_rank[r],
                         .assignment = std::move(told[r])});
  }
}

std::vector<RoundAssignment> Rendezvous::assignments() const {
  std::vector<RoundAssignment> out;
  if (!formed_ || members_.empty()) return out;
  RoundAssignment base;
  base.round = round_;
  base.group_world_size = static_cast<int>(members_.size());
  base.store_prefix = round_store_prefix(generation_, round_);
  const NodeInfo& first = nodes_.at(members_.front()).info;
  base.master_addr = first.host;
  base.master_port = first.master_port;
  base.restart_count = round_restart_count_;
  out.reserve(members_.size());
  for (std::size_t r = 0; r < members_.size(); ++r) {
    RoundAssignment a = base;
    a.group_rank = static_cast<int>(r);
    a.rank_offset = base.world_size;
    base.world_size += nodes_.at(members_[r]).info.local_world_size;
    out.push_back(std::move(a));
  }
  for (auto& a : out) a.world_size = base.world_size;
  return out;
}

void Rendezvous::set_round_restart_count(int count) {
  if (!formed_ || count == round_restart_count_) return;
  round_restart_count_ = count;
  ++revision_;
}

std::optional<int> Rendezvous::member_restart_count(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  if (!formed_ || it == nodes_.end() || it->second.place != Place::kMember) return std::nullopt;
  return round_restart_count_;
}

std::optional<RoundAssignment> Rendezvous::assignment(const std::string& node_id) const {
  auto at = std::find(members_.begin(), members_.end(), node_id);
  if (!formed_ || at == members_.end()) return std::nullopt;
  return assignments()[at - members_.begin()];
}

bool Rendezvous::is_joining(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it != nodes_.end() &&
         (it->second.place == Place::kPending || it->second.place == Place::kWaiting);
}

std::vector<std::string> Rendezvous::node_ids() const {
  std::vector<std::string> ids;
  ids.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) ids.push_back(id);
  return ids;
}

std::size_t Rendezvous::ranks() const {
  std::size_t n = 0;
  for (const auto& [id, node] : nodes_)
    n += static_cast<std::size_t>(std::max(node.info.local_world_size, 0));
  return n;
}

std::optional<std::string> Rendezvous::departure(const std::string& node_id) const {
  for (auto it = departures_.rbegin(); it != departures_.rend(); ++it) {
    if (it->first == node_id) return it->second;
  }
  return std::nullopt;
}

std::vector<Notice> Rendezvous::remove_node(const std::string& node_id, const std::string& reason) {
  std::vector<Notice> out;
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return out;
  const Place where = it->second.place;
  if (where == Place::kMember && it->second.succeeded) return out;  // done; its result stands
  if (where == Place::kDone) {
    place(it->second, Place::kNew);  // keep the counts exact before erasing
    --place_counts_[static_cast<int>(Place::kNew)];
    nodes_.erase(it);
    return out;
  }
  ++revision_;
  departures_.emplace_back(node_id, reason);
  constexpr std::size_t kDeparturesKept = 16;
  if (departures_.size() > kDeparturesKept) departures_.erase(departures_.begin());
  log("node '" + node_id + "' left: " + reason);
  emit("node_lost", {{"node", node_id}, {"reason", reason}});
  if (where == Place::kMember && state_ == JobState::kRunning) {
    reopen("node '" + node_id + "' left (" + reason + ")", node_id, out);
  }
  std::erase(members_, node_id);
  --place_counts_[static_cast<int>(nodes_.at(node_id).place)];
  nodes_.erase(node_id);
  // Lost after every other node had finished (a dead machine is seen only when its keep-alives
  // or its lease run out): nobody is left to form a round, and what the job had to do is done.
  if (state_ == JobState::kRunning && count(Place::kDone) > 0 &&
      static_cast<std::size_t>(count(Place::kDone)) == nodes_.size()) {
    end(JobState::kSucceeded, "every node succeeded (node '" + node_id + "' left after them)", out);
    return out;
  }
  maybe_form(out);
  return out;
}

void Rendezvous::keep_alive(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second.last_seen = clock_.now();
}

Result<std::vector<Notice>> Rendezvous::report(const std::string& node_id, bool succeeded,
                                               const std::string& message) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() ||
      (it->second.place != Place::kMember && it->second.place != Place::kStale)) {
    return Error{ErrorCode::kConflict,
                 "node '" + node_id + "' is not a member of job '" + job_id_ + "'"};
  }
  std::vector<Notice> out;
  if (state_ != JobState::kRunning) return out;
  if (!succeeded) {
    end(JobState::kFailed, "node '" + node_id + "' failed: " + message, out);
    return out;
  }
  it->second.succeeded = true;
  ++revision_;
  log("node '" + node_id + "' succeeded");
  emit("node_succeeded", {{"node", node_id}});
  const bool all = formed_ && std::all_of(members_.begin(), members_.end(), [this](const auto& id) {
                     return nodes_.at(id).succeeded;
                   });
  if (all) end(JobState::kSucceeded, "every node succeeded", out);
  return out;
}

std::vector<Notice> Rendezvous::close(const std::string& reason) {
  std::vector<Notice> out;
  if (state_ == JobState::kRunning) end(JobState::kClosed, reason, out);
  return out;
}

void Rendezvous::end(JobState state, const std::string& reason, std::vector<Notice>& out) {
  state_ = state;
  end_reason_ = reason;
  last_call_deadline_.reset();
  ++revision_;
  log(std::string(job_state_name(state)) + ": " + reason);
  emit("job_end", {{"state", std::string(job_state_name(state))}, {"reason", reason}});
  for (const auto& [id, n] : nodes_) {
    if (n.place == Place::kPending || n.place == Place::kWaiting) {
      out.push_back(Notice{
          .kind = Notice::Kind::kJoinFailed,
          .node_id = id,
          .error =
              Error{ErrorCode::kClosed, "job '" + job_id_ + "' ended (" +
                                            std::string(job_state_name(state)) + "): " + reason}});
    } else {
      out.push_back(
          Notice{.kind = Notice::Kind::kJobEnded, .node_id = id, .reason = reason, .state = state});
    }
  }
}

std::vector<Notice> Rendezvous::tick() {
  std::vector<Notice> out;
  const TimePoint now = clock_.now();
  const Duration silence_limit = config_.keep_alive_interval * config_.keep_alive_max_attempt;
  std::vector<std::string> silent;
  std::vector<std::string> timed_out;
  for (const auto& [id, n] : nodes_) {
    if (n.succeeded) continue;  // finished nodes may go quiet
    if (now - n.last_seen > silence_limit) {
      silent.push_back(id);
    } else if ((n.place == Place::kPending || n.place == Place::kWaiting) &&
               now - n.joined_at >= config_.join_timeout) {
      timed_out.push_back(id);
    }
  }
  for (const auto& id : silent) {
    const std::string why = "no keep-alive for " + std::to_string(to_millis(silence_limit)) + " ms";
    const Place where = nodes_.at(id).place;
    if (where == Place::kPending || where == Place::kWaiting) {
      // Its join is still waiting for an answer: give it one.
      out.push_back(Notice{
          .kind = Notice::Kind::kJoinFailed,
          .node_id = id,
          .error = Error{ErrorCode::kTimeout, "dropped from job '" + job_id_ + "': " + why}});
    }
    auto more = remove_node(id, why);
    out.insert(out.end(), more.begin(), more.end());
  }
  for (const auto& id : timed_out) {
    if (!nodes_.count(id)) continue;
    const int pending = count(Place::kPending);
    const std::string why = "round " + std::to_string(round_) + " of job '" + job_id_ +
                            "' did not form within join_timeout (" +
                            std::to_string(to_millis(config_.join_timeout)) +
                            " ms): " + std::to_string(pending) + " of min " +
                            std::to_string(config_.min_nodes) + " nodes joined";
    out.push_back(Notice{.kind = Notice::Kind::kJoinFailed,
                         .node_id = id,
                         .error = Error{ErrorCode::kTimeout, why}});
    auto more = remove_node(id, why);
    out.insert(out.end(), more.begin(), more.end());
  }
  if (last_call_deadline_ && now >= *last_call_deadline_ && !formed_ &&
      state_ == JobState::kRunning && count(Place::kPending) >= config_.min_nodes) {
    form(out);
  }
  return out;
}

std::optional<TimePoint> Rendezvous::next_deadline() const {
  std::optional<TimePoint> next = last_call_deadline_;
  for (const auto& [id, n] : nodes_) {
    if (n.place == Place::kPending || n.place == Place::kWaiting) {
      const TimePoint due = n.joined_at + config_.join_timeout;
      if (!next || due < *next) next = due;
    }
  }
  return next;
}

Json Rendezvous::describe() const {
  Json nodes = Json::array();
  const TimePoint now = clock_.now();
  for (const auto& [id, n] : nodes_) {
    static constexpr const char* kPlaces[] = {"pending", "waiting", "member",
                                              "stale",   "new",     "done"};
    auto rank = std::find(members_.begin(), members_.end(), id);
    nodes.push_back({{"node", id},
                     {"host", n.info.host},
                     {"local_world_size", n.info.local_world_size},
                     {"place", kPlaces[static_cast<int>(n.place)]},
                     {"group_rank", rank == members_.end() ? -1 : rank - members_.begin()},
                     {"succeeded", n.succeeded},
                     {"last_seen_ms_ago", to_millis(now - n.last_seen)}});
  }
  return Json{{"job", job_id_},
              {"state", job_state_name(state_)},
              {"round", round_},
              {"formed", formed_},
              {"min_nodes", config_.min_nodes},
              {"max_nodes", config_.max_nodes},
              {"nodes_waiting", nodes_waiting()},
              {"end_reason", end_reason_},
              {"nodes", std::move(nodes)}};
}

}  // namespace ctrun::rendezvous

namespace ctrun::rendezvous {

Json Rendezvous::save() const {
  const TimePoint now = clock_.now();
  Json nodes = Json::array();
  for (const auto& [id, n] : nodes_) {
    nodes.push_back({{"node", id},
                     {"host", n.info.host},
                     {"local_world_size", n.info.local_world_size},
                     {"master_port", n.info.master_port},
                     {"requested_rank", n.info.requested_rank},
                     {"place", static_cast<int>(n.place)},
                     {"join_seq", n.join_seq},
                     {"succeeded", n.succeeded},
                     // how long its join has waited (join_timeout); 0 once placed
                     {"waited_ms", n.place == Place::kPending || n.place == Place::kWaiting
                                       ? to_millis(now - n.joined_at)
                                       : 0}});
  }
  Json departures = Json::array();
  for (const auto& [id, why] : departures_) departures.push_back({id, why});
  Json last_rank = Json::object();
  for (const auto& [id, r] : last_rank_) last_rank[id] = r;
  return Json{
      {"job", job_id_},
      {"generation", generation_},
      {"min_nodes", config_.min_nodes},
      {"max_nodes", config_.max_nodes},
      {"join_timeout_ms", to_millis(config_.join_timeout)},
      {"last_call_timeout_ms", to_millis(config_.last_call_timeout)},
      {"close_timeout_ms", to_millis(config_.close_timeout)},
      {"keep_alive_interval_ms", to_millis(config_.keep_alive_interval)},
      {"keep_alive_max_attempt", config_.keep_alive_max_attempt},
      {"round", round_},
      {"formed", formed_},
      {"round_restart_count", round_restart_count_},
      {"last_call_ms",
       last_call_deadline_ ? std::max<std::int64_t>(0, to_millis(*last_call_deadline_ - now)) : -1},
      {"saved_unix_ms", clock_.unix_millis()},
      {"state", static_cast<int>(state_)},
      {"open_reason", open_reason_},
      {"end_reason", end_reason_},
      {"departures", std::move(departures)},
      {"next_join_seq", next_join_seq_},
      {"members", members_},
      {"last_rank", std::move(last_rank)},
      {"nodes", std::move(nodes)}};
}

Result<std::unique_ptr<Rendezvous>> Rendezvous::restore(const Json& j, const Clock& clock,
                                                        Logger log, Timers timers) {
  // The record was written by save(); a mismatch means a damaged or foreign state file.
  try {
    RendezvousConfig config;
    config.min_nodes = j.at("min_nodes").get<int>();
    config.max_nodes = j.at("max_nodes").get<int>();
    config.join_timeout = std::chrono::milliseconds(j.at("join_timeout_ms").get<std::int64_t>());
    config.last_call_timeout =
        std::chrono::milliseconds(j.at("last_call_timeout_ms").get<std::int64_t>());
    config.close_timeout = std::chrono::milliseconds(j.at("close_timeout_ms").get<std::int64_t>());
    config.keep_alive_interval =
        std::chrono::milliseconds(j.at("keep_alive_interval_ms").get<std::int64_t>());
    config.keep_alive_max_attempt = j.at("keep_alive_max_attempt").get<int>();
    if (auto s = validate(config); !s) return s.error();
    auto r = std::make_unique<Rendezvous>(j.at("job").get<std::string>(), config, clock,
                                          std::move(log), j.at("generation").get<int>());
    const TimePoint now = clock.now();
    // kCarried: the time since the writer saved counts against its deadlines. (Wall clocks of
    // different machines agree only as well as NTP keeps them; a reading from the future is 0.)
    const bool carried = timers == Timers::kCarried;
    const std::chrono::milliseconds since_saved(
        carried ? std::max<std::int64_t>(
                      0, clock.unix_millis() - j.value("saved_unix_ms", clock.unix_millis()))
                : 0);
    r->round_ = j.at("round").get<int>();
    r->formed_ = j.at("formed").get<bool>();
    r->round_restart_count_ = j.value("round_restart_count", -1);  // absent before 2026-11-24
    const auto last_call = j.at("last_call_ms").get<std::int64_t>();
    if (last_call >= 0) {
      r->last_call_deadline_ = now + std::max(std::chrono::milliseconds(last_call) - since_saved,
                                              std::chrono::milliseconds(0));
    }
    const int state = j.at("state").get<int>();
    if (state < 0 || state > static_cast<int>(JobState::kClosed)) {
      return Error{ErrorCode::kBadRequest, "saved job state " + std::to_string(state)};
    }
    r->state_ = static_cast<JobState>(state);
    r->end_reason_ = j.at("end_reason").get<std::string>();
    r->open_reason_ = j.value("open_reason", "");  // absent from state files before 2026-11
    for (const auto& d : j.value("departures", Json::array())) {
      r->departures_.emplace_back(d.at(0).get<std::string>(), d.at(1).get<std::string>());
    }
    r->next_join_seq_ = j.at("next_join_seq").get<std::uint64_t>();
    r->members_ = j.at("members").get<std::vector<std::string>>();
    for (const auto& [id, rank] : j.at("last_rank").items()) r->last_rank_[id] = rank.get<int>();
    for (const auto& n : j.at("nodes")) {
      Node node;
      node.info.node_id = n.at("node").get<std::string>();
      node.info.host = n.at("host").get<std::string>();
      node.info.local_world_size = n.at("local_world_size").get<int>();
      node.info.master_port = n.at("master_port").get<int>();
      node.info.requested_rank = n.at("requested_rank").get<int>();
      const int where = n.at("place").get<int>();
      if (where < 0 || where > static_cast<int>(Place::kDone)) {
        return Error{ErrorCode::kBadRequest, "saved node place " + std::to_string(where)};
      }
      node.place = static_cast<Place>(where);
      node.join_seq = n.at("join_seq").get<std::uint64_t>();
      node.succeeded = n.at("succeeded").get<bool>();
      node.joined_at =
          carried ? now - std::chrono::milliseconds(n.value("waited_ms", 0)) - since_saved : now;
      node.last_seen = now;
      ++r->place_counts_[where];
      r->nodes_.emplace(node.info.node_id, std::move(node));
    }
    for (const auto& id : r->members_) {
      if (!r->nodes_.count(id)) {
        return Error{ErrorCode::kBadRequest, "saved member '" + id + "' is not a node"};
      }
    }
    return r;
  } catch (const Json::exception& e) {
    return Error{ErrorCode::kBadRequest, std::string("saved rendezvous: ") + e.what()};
  }
}

}  // namespace ctrun::rendezvous
