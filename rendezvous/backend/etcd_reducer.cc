#include "rendezvous/backend/etcd_reducer.h"

#include <algorithm>

#include "ctrun/rendezvous/round.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/etcd_quorum.h"
#include "rendezvous/etcd/state_value.h"

namespace ctrun::rendezvous {

namespace {

// With etcd the Rendezvous's own keep-alive deadline is off: leases say who is alive.
constexpr Duration kNoKeepAliveDeadline = std::chrono::hours(24 * 365);

RendezvousConfig without_keep_alives(RendezvousConfig c) {
  c.keep_alive_interval = kNoKeepAliveDeadline;
  c.keep_alive_max_attempt = 1;
  return c;
}

// Another agent's request, as it left it under joins/<its id>; nullopt for a value that is not
// one (it is left alone: that agent's own join says what is wrong).
std::optional<JoinRequest> parse_join_request(const std::string& node_id, const std::string& text) {
  auto request = join_request_from_json(Json::parse(text, nullptr, false));
  if (!request || request.value().node.node_id != node_id) return std::nullopt;
  return request.value();
}

bool starts_with(const std::string& key, const std::string& prefix) {
  return key.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

EtcdReducer::EtcdReducer(std::string job, const Clock& clock)
    : job_(std::move(job)),
      clock_(clock),
      prefix_(etcd_job_prefix(job_)),
      state_key_(prefix_ + "rendezvous"),
      nodes_prefix_(prefix_ + "nodes/"),
      joins_prefix_(prefix_ + "joins/"),
      store_prefix_(prefix_ + "store/"),
      ops_prefix_(prefix_ + "ops/") {}

etcd::Txn EtcdReducer::load_request() const {
  etcd::Txn txn;
  txn.success.push_back(etcd::range_op(state_key_, ""));
  txn.success.push_back(etcd::range_op(nodes_prefix_, etcd::prefix_end(nodes_prefix_)));
  txn.success.push_back(etcd::range_op(joins_prefix_, etcd::prefix_end(joins_prefix_)));
  return txn;
}

etcd::Txn EtcdReducer::reload_request() const {
  etcd::Txn txn;
  txn.success.push_back(etcd::range_op(state_key_, ""));
  txn.success.push_back(etcd::range_op(joins_prefix_, etcd::prefix_end(joins_prefix_)));
  return txn;
}

etcd::Txn EtcdReducer::turn_request() const {
  etcd::Txn txn;
  const auto own = joins_.find(node_id_);
  const std::int64_t own_rev = own == joins_.end() ? 1 : own->second.mod_revision;
  txn.success.push_back(
      etcd::older_keys_op(joins_prefix_, own_rev, static_cast<std::int64_t>(kJoinWriters)));
  return txn;
}

Status EtcdReducer::take_turn(const etcd::TxnResult& read) {
  if (read.ranges.size() != 1) {
    return Error{ErrorCode::kInternal, "etcd: a one-range transaction answered " +
                                           std::to_string(read.ranges.size()) + " ranges"};
  }
  older_ids_.clear();
  for (const auto& kv : read.ranges[0].kvs) {
    std::string id = kv.key.substr(joins_prefix_.size());
    if (id != node_id_) older_ids_.push_back(std::move(id));
  }
  older_rev_ = read.revision;
  return ok_status();
}

Status EtcdReducer::take_load(const etcd::TxnResult& read) {
  if (read.ranges.size() != 3) {
    return Error{ErrorCode::kInternal, "etcd: a three-range transaction answered " +
                                           std::to_string(read.ranges.size()) + " ranges"};
  }
  const etcd::KeyValue* state = read.ranges[0].kvs.empty() ? nullptr : &read.ranges[0].kvs.front();
  take_state(state, read.revision);
  take_joins(read.ranges[2].kvs, read.revision);
  live_.clear();
  for (const auto& kv : read.ranges[1].kvs) live_.insert(kv.key.substr(nodes_prefix_.size()));
  // Dead: nodes of the state *as this read saw it* without a key (the cache may be newer, with
  // nodes whose keys this read predates), and those seen deleted before, unless back now.
  std::erase_if(dead_, [this](const auto& entry) { return live_.count(entry.first) != 0; });
  if (state) {
    auto seen = etcd_restore_state(*state, clock_);
    if (seen) {
      for (const auto& id : seen.value()->node_ids()) {
        if (!live_.count(id)) dead_.emplace(id, read.revision);
      }
    }
  }
  loaded_ = true;
  return ok_status();
}

Status EtcdReducer::take_reload(const etcd::TxnResult& read) {
  if (read.ranges.size() != 2) {
    return Error{ErrorCode::kInternal, "etcd: a two-range transaction answered " +
                                           std::to_string(read.ranges.size()) + " ranges"};
  }
  take_state(read.ranges[0].kvs.empty() ? nullptr : &read.ranges[0].kvs.front(), read.revision);
  take_joins(read.ranges[1].kvs, read.revision);
  return ok_status();
}

bool EtcdReducer::take_watch(const etcd::WatchMessage& message) {
  bool changed = false;  // ops/ (store add markers) changes nothing here
  for (const auto& e : message.events) {
    const std::string& key = e.kv.key;
    if (key == state_key_) {
      take_state(e.deleted ? nullptr : &e.kv, e.kv.mod_revision);
      changed = true;
    } else if (starts_with(key, nodes_prefix_)) {
      changed = true;
      const std::string id = key.substr(nodes_prefix_.size());
      if (e.deleted) {
        live_.erase(id);
        dead_[id] = e.kv.mod_revision;
      } else {
        live_.insert(id);
        dead_.erase(id);
      }
    }
  }
  return changed;
}

etcd::Txn EtcdReducer::node_keys_request(const std::vector<std::string>& ids) const {
  etcd::Txn txn;
  for (std::size_t i = 0; i < ids.size() && i < kNodeKeysPerRead; ++i) {
    txn.success.push_back(etcd::range_op(nodes_prefix_ + ids[i]));
  }
  return txn;
}

Status EtcdReducer::take_node_keys(const std::vector<std::string>& ids,
                                   const etcd::TxnResult& read) {
  const std::size_t asked = std::min(ids.size(), kNodeKeysPerRead);
  if (read.ranges.size() != asked) {
    return Error{ErrorCode::kInternal, "etcd: a read of " + std::to_string(asked) +
                                           " node keys answered " +
                                           std::to_string(read.ranges.size()) + " ranges"};
  }
  for (std::size_t i = 0; i < asked; ++i) {
    const std::string& id = ids[i];
    if (id == node_id_) continue;  // this agent knows its own
    auto gone = dead_.find(id);
    if (gone != dead_.end() && gone->second > read.revision) continue;  // deleted since the read
    if (read.ranges[i].kvs.empty()) {
      live_.erase(id);
      dead_.emplace(id, read.revision);
    } else {
      live_.insert(id);
      if (gone != dead_.end()) dead_.erase(gone);
    }
  }
  return ok_status();
}

void EtcdReducer::own_node_key_put() {
  live_.insert(node_id_);
  dead_.erase(node_id_);
}

void EtcdReducer::own_join_put(etcd::KeyValue request) { joins_[node_id_] = std::move(request); }

bool EtcdReducer::own_join_dropped() { return joins_.erase(node_id_) != 0; }

// Takes what a read at `revision` saw of the state key, unless the cache is newer.
void EtcdReducer::take_state(const etcd::KeyValue* kv, std::int64_t revision) {
  if (revision < state_rev_) return;
  if (kv) {
    auto decoded = etcd::decode_state_value(state_key_, kv->value);
    state_json_ = decoded ? std::move(decoded).value() : Json(Json::value_t::discarded);
    unreadable_state_ = decoded ? "" : decoded.error().message;
    state_rev_ = kv->mod_revision;
  } else {
    state_json_ = nullptr;
    state_rev_ = 0;
  }
  view_ok_ = false;
}

// Takes what a read at `revision` saw under joins/, unless the cache is newer.
void EtcdReducer::take_joins(const std::vector<etcd::KeyValue>& kvs, std::int64_t revision) {
  if (revision < joins_rev_) return;
  // This node's own request, put after the read was answered, stays.
  std::optional<etcd::KeyValue> own;
  if (auto it = joins_.find(node_id_); it != joins_.end() && it->second.mod_revision > revision) {
    own = it->second;
  }
  joins_.clear();
  for (const auto& kv : kvs) joins_[kv.key.substr(joins_prefix_.size())] = kv;
  if (own) joins_[node_id_] = *own;
  joins_rev_ = revision;
}

Result<std::unique_ptr<Rendezvous>> EtcdReducer::restore_current(Rendezvous::Logger log) const {
  if (state_json_.is_null()) return std::unique_ptr<Rendezvous>();
  if (state_json_.is_discarded()) return Error{ErrorCode::kBadRequest, unreadable_state_};
  return Rendezvous::restore(state_json_, clock_, std::move(log), Rendezvous::Timers::kCarried);
}

// Restored once per change, for reading: every agent reads it on every change, and a restore
// is O(nodes).
Result<const Rendezvous*> EtcdReducer::view() {
  if (!view_ok_) {
    auto current = restore_current();
    if (!current) return current.error();
    view_ = std::move(current).value();
    view_ok_ = true;
  }
  return static_cast<const Rendezvous*>(view_.get());
}

Result<EtcdReducer::Plan> EtcdReducer::plan(const Change& change,
                                            std::optional<RestartCounter> counter) const {
  Write write;
  // Lines and events are kept until the write lands: a lost race must not tell them twice.
  auto log = [&write](const std::string& line) { write.lines.push_back(line); };
  auto sink = [&write](const std::string& name, Json fields) {
    write.events.emplace_back(name, std::move(fields));
  };
  auto current = restore_current(log);
  if (!current) return current.error();
  std::unique_ptr<Rendezvous> state = std::move(current).value();
  const Rendezvous* original = state.get();
  if (state) state->set_event_sink(sink);
  const std::uint64_t before = state ? state->revision() : 0;
  std::vector<etcd::Operation> also;
  std::vector<etcd::Compare> checks;
  Edit edit{state, also, checks, write.applied, log, sink};
  if (auto s = change(edit); !s) return s.error();
  if (state && state->round_restart_count_unset()) {
    // This write forms the round: its members' restart count is the counter now, and the write
    // lands only if the counter is still what was read (a peer's restart for a failure in the
    // new round must not be counted in it).
    if (state.get() != original) {
      state->set_round_restart_count(0);  // a new job: this write deletes the old store
    } else if (!counter) {
      return Plan{std::nullopt, true};
    } else {
      state->set_round_restart_count(static_cast<int>(std::max(0LL, counter->value)));
      checks.push_back(etcd::unchanged_since(store_prefix_ + kRestartsKey, counter->mod_revision));
    }
  }
  if (!state || (state.get() == original && state->revision() == before)) return Plan{};

  write.txn.compare.push_back(etcd::unchanged_since(state_key_, state_rev_));
  for (auto& c : checks) write.txn.compare.push_back(std::move(c));
  // Text from workers (failure reasons) may not be UTF-8: replaced, never a throw.
  write.text = etcd::encode_state_value(state->save());
  write.txn.success.push_back(etcd::put_op(state_key_, write.text));
  for (auto& op : also) write.txn.success.push_back(std::move(op));
  return Plan{std::move(write), false};
}

void EtcdReducer::written(const Write& write, std::int64_t revision) {
  if (revision >= state_rev_) {
    // As a read of it would give (text that is not UTF-8 replaced).
    auto decoded = etcd::decode_state_value(state_key_, write.text);
    state_json_ = decoded ? std::move(decoded).value() : Json(Json::value_t::discarded);
    state_rev_ = revision;
    view_ok_ = false;
  }
  for (const auto& id : write.applied) {  // the write deleted their keys
    auto it = joins_.find(id);
    if (it != joins_.end() && it->second.mod_revision < revision) joins_.erase(it);
  }
  // A read older than this write must not bring those requests back.
  joins_rev_ = std::max(joins_rev_, revision);
}

bool EtcdReducer::holds(const Write& write) const {
  auto decoded = etcd::decode_state_value(state_key_, write.text);
  return decoded && state_json_ == decoded.value();
}

EtcdReducer::Change EtcdReducer::enter(const NodeInfo& node, const RendezvousConfig& config,
                                       JoinTurn turn) const {
  return [this, node, config, turn](Edit& edit) -> Status {
    // Taken in already (by another agent's write): the requests still waiting are their own
    // agents' to write. Were every agent to go on taking in the others', a thousand of them
    // would race for the one key and some would lose every race until their deadline.
    if (!joins_.count(node_id_)) return ok_status();
    std::unique_ptr<Rendezvous>& r = edit.state;
    // Every node of an ended job is gone: the same id starts a new job, as with ctrund. Its
    // store (and its add markers) and its replicas' quorum go with the old job.
    const bool replace = r && r->state() != JobState::kRunning && !any_live_peer(*r);
    if (turn == JoinTurn::kAfterOlder && (!r || replace) && behind_older_requests(nullptr)) {
      return ok_status();  // the oldest requests' agents start the job
    }
    if (!r || replace) {
      const int generation = r ? r->generation() + 1 : 0;
      if (r) {
        edit.also.push_back(etcd::delete_op(store_prefix_, etcd::prefix_end(store_prefix_)));
        edit.also.push_back(etcd::delete_op(ops_prefix_, etcd::prefix_end(ops_prefix_)));
        // The fault-tolerant replicas' quorum (etcd_quorum.h) too: the new job's forms anew.
        const std::string quorum = etcd_quorum_prefix(job_);
        edit.also.push_back(etcd::delete_op(quorum, etcd::prefix_end(quorum)));
      }
      r = std::make_unique<Rendezvous>(job_, without_keep_alives(config), clock_, edit.log,
                                       generation);
      r->set_event_sink(edit.events);
    } else if (r->config().min_nodes != config.min_nodes ||
               r->config().max_nodes != config.max_nodes) {
      return Error{ErrorCode::kConflict,
                   "job '" + job_ + "' runs with nnodes " + std::to_string(r->config().min_nodes) +
                       ":" + std::to_string(r->config().max_nodes) + ", this node asked for " +
                       std::to_string(config.min_nodes) + ":" + std::to_string(config.max_nodes)};
    }
    (void)node;  // its request is under joins/, taken in with the others
    if (turn == JoinTurn::kAfterOlder && r->state() == JobState::kRunning &&
        behind_older_requests(r.get())) {
      return ok_status();
    }
    return take_in_joins(edit);
  };
}

bool EtcdReducer::writes_joins() {
  const auto own = joins_.find(node_id_);
  if (own == joins_.end()) return false;
  WritesJoinsMemo& memo = writes_joins_memo_;
  if (memo.state_rev == state_rev_ && memo.joins_rev == joins_rev_ &&
      memo.own_rev == own->second.mod_revision && memo.older_rev == older_rev_) {
    return memo.writes;
  }
  auto current = view();
  if (!current) return true;
  const Rendezvous* r = current.value();
  if (r && (r->is_joining(node_id_) || r->assignment(node_id_))) return false;  // taken in
  memo = {state_rev_, joins_rev_, own->second.mod_revision, older_rev_,
          !behind_older_requests(r && r->state() == JobState::kRunning ? r : nullptr)};
  return memo.writes;
}

bool EtcdReducer::in_state() {
  auto current = view();
  return current && current.value() && current.value()->has_node(node_id_);
}

bool EtcdReducer::behind_older_requests(const Rendezvous* r) const {
  const auto own = joins_.find(node_id_);
  if (own == joins_.end()) return false;
  std::size_t older = 0;
  if (older_rev_ > joins_rev_ && older_rev_ >= own->second.mod_revision) {  // the turn's read
    for (const auto& id : older_ids_) {
      if (r && (r->is_joining(id) || r->assignment(id))) continue;  // taken in since the read
      ++older;
    }
    return older >= kJoinWriters;
  }
  for (const auto& [id, kv] : joins_) {
    if (id == node_id_ || kv.mod_revision >= own->second.mod_revision) continue;
    if (r && (r->is_joining(id) || r->assignment(id))) continue;  // taken in since the read
    // Requests no write takes in (not one, another nnodes) are their own agents' to end.
    auto request = parse_join_request(id, kv.value);
    if (!request) continue;
    if (r && (request->config.min_nodes != r->config().min_nodes ||
              request->config.max_nodes != r->config().max_nodes)) {
      continue;
    }
    if (++older >= kJoinWriters) return true;
  }
  return false;
}

// Takes the pending join requests into the running job, this node's first and then the oldest,
// at most kJoinsPerWrite. Each is deleted by the same write, on condition that it is the very
// request that was read: no request is ever taken in twice. Requests that do not fit the job
// (another nnodes, a taken rank) are left to their agents, whose own join says why.
Status EtcdReducer::take_in_joins(Edit& edit) const {
  Rendezvous& r = *edit.state;
  if (r.state() != JobState::kRunning) return ok_status();
  // This node's own first, then the oldest: with more requests than one write takes, none
  // waits behind later ones (taken in by id, the last ids lost every race of a 1,024-node job).
  std::vector<std::string> order;
  for (const auto& [id, kv] : joins_) {
    if (id != node_id_) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(), [this](const std::string& a, const std::string& b) {
    return joins_.at(a).mod_revision < joins_.at(b).mod_revision;
  });
  if (joins_.count(node_id_)) order.insert(order.begin(), node_id_);
  for (const auto& id : order) {
    if (edit.applied.size() >= kJoinsPerWrite) break;
    // Taken in by a write this agent's watch brought since it read the requests: that write
    // deleted the key, and a compare on it would fail the whole write.
    if (id != node_id_ && (r.is_joining(id) || r.assignment(id))) continue;
    const etcd::KeyValue& kv = joins_.at(id);
    auto request = parse_join_request(id, kv.value);
    if (!request || request->config.min_nodes != r.config().min_nodes ||
        request->config.max_nodes != r.config().max_nodes) {
      continue;
    }
    if (auto joined = r.join(request->node); !joined) {
      if (id == node_id_) return joined.error();
      continue;
    }
    edit.checks.push_back(etcd::Compare{kv.key, etcd::Compare::Target::kMod,
                                        etcd::Compare::Result::kEqual, kv.mod_revision, ""});
    edit.also.push_back(etcd::delete_op(kv.key));
    edit.applied.push_back(id);
  }
  return ok_status();
}

EtcdReducer::Change EtcdReducer::report(bool succeeded, std::string message) const {
  return [this, succeeded, message](Edit& edit) -> Status {
    if (!edit.state) return Error{ErrorCode::kConflict, "job '" + job_ + "' is gone"};
    auto notices = edit.state->report(node_id_, succeeded, message);
    return notices ? ok_status() : Status(notices.error());
  };
}

EtcdReducer::Change EtcdReducer::leave() const {
  return [this](Edit& edit) -> Status {
    if (edit.state) edit.state->remove_node(node_id_, "left");
    return ok_status();
  };
}

EtcdReducer::Change EtcdReducer::tick() const {
  return [](Edit& edit) -> Status {
    if (edit.state) edit.state->tick();
    return ok_status();
  };
}

EtcdReducer::Change EtcdReducer::remove(std::vector<std::string> nodes, std::string why) const {
  return [nodes, why](Edit& edit) -> Status {
    for (const auto& id : nodes) {
      if (edit.state) edit.state->remove_node(id, why);
    }
    return ok_status();
  };
}

bool EtcdReducer::any_live_peer(const Rendezvous& r) const {
  for (const auto& id : r.node_ids()) {
    if (id != node_id_ && live_.count(id)) return true;
  }
  return false;
}

void EtcdReducer::begin_join() {
  running_round_.reset();
  end_sent_ = false;
}

Result<EtcdReducer::JoinStep> EtcdReducer::join_step() {
  auto current = view();
  if (!current) return current.error();
  const Rendezvous* r = current.value();
  // No job yet, or an ended one whose nodes are all gone: a waiting request's write starts the
  // job (enter()), and this one's agent may not have written yet.
  if ((!r || (r->state() != JobState::kRunning && !any_live_peer(*r))) && joins_.count(node_id_)) {
    return JoinStep{JoinStep::Kind::kTakeIn};
  }
  if (!r) return Error{ErrorCode::kClosed, "etcd key " + state_key_ + " was deleted"};
  if (r->state() != JobState::kRunning) {
    return Error{ErrorCode::kClosed, "job '" + job_ + "' ended (" +
                                         std::string(job_state_name(r->state())) +
                                         "): " + r->end_reason()};
  }
  // Asked and not taken in yet: this node's request is not in the state (the cache of requests
  // is only as fresh as the last read).
  const bool pending =
      joins_.count(node_id_) != 0 && !r->is_joining(node_id_) && !r->assignment(node_id_);
  if (!r->has_node(node_id_) && !pending) {
    return Error{ErrorCode::kTimeout,
                 "dropped from job '" + job_ +
                     "': " + r->departure(node_id_).value_or("removed by another node")};
  }
  if (auto a = r->assignment(node_id_)) {
    running_round_ = a->round;
    reported_round_ = std::max(reported_round_, a->round);
    return JoinStep{JoinStep::Kind::kJoined, *a};
  }
  // Not taken in yet: the write that would have taken it in lost its race.
  if (pending) return JoinStep{JoinStep::Kind::kTakeIn};
  // The round this node entered formed and reopened before this node read the state (a watch
  // may bring several changes at once): it joins the next round, as it would have on the
  // reopened round's notice.
  if (!r->is_joining(node_id_)) return JoinStep{JoinStep::Kind::kAskAgain};
  return JoinStep{JoinStep::Kind::kWait};
}

EtcdReducer::Notice EtcdReducer::notice() {
  auto current = view();
  if (!running_round_ || !current || !current.value()) return {};
  const Rendezvous& r = *current.value();
  if (r.state() != JobState::kRunning) {
    if (end_sent_) return {};
    end_sent_ = true;
    return Notice{BackendEvent{.kind = BackendEvent::Kind::kJobEnded,
                               .state = std::string(job_state_name(r.state())),
                               .reason = r.end_reason()},
                  std::nullopt};
  }
  if (r.round() > reported_round_) {
    reported_round_ = r.round();
    return Notice{BackendEvent{.kind = BackendEvent::Kind::kRoundReopened,
                               .round = r.round(),
                               .reason = r.open_reason()},
                  std::nullopt};
  }
  if (!r.has_node(node_id_)) {
    // Told once: the node is in no round until it joins again. Told again, a drop read after a
    // reconnect (the state still without the node) would stop the new lease's renewals while
    // the agent joins again on it, and the lease would run out under the round it joins.
    running_round_.reset();
    return Notice{std::nullopt, "dropped from job '" + job_ + "': " +
                                    r.departure(node_id_).value_or("removed by another node")};
  }
  return {};
}

std::vector<std::string> EtcdReducer::removable_dead() {
  auto current = view();
  if (!current || !current.value()) return {};
  const Rendezvous& seen = *current.value();
  auto candidate = [&](const std::string& id) {
    return id != node_id_ && !live_.count(id) && seen.has_node(id);
  };
  if (std::none_of(dead_.begin(), dead_.end(),
                   [&](const auto& entry) { return candidate(entry.first); })) {
    return {};
  }
  // Which removals would change the state (not, e.g., a member that already succeeded): tried
  // on a copy of its own.
  auto copy = restore_current();
  if (!copy || !copy.value()) return {};
  Rendezvous& r = *copy.value();
  std::vector<std::string> gone;
  for (const auto& [id, seen_gone] : dead_) {
    if (!candidate(id)) continue;
    const auto before = r.revision();
    r.remove_node(id, "");
    if (r.revision() != before) gone.push_back(id);
  }
  return gone;
}

bool EtcdReducer::writes_removals() {
  auto current = view();
  if (!current || !current.value()) return false;
  std::size_t ahead = 0;
  for (const auto& id : current.value()->node_ids()) {
    if (id == node_id_) return live_.count(id) != 0;  // its own lease gone: not any more
    if (live_.count(id) && ++ahead >= kRemovalWriters) return false;
  }
  return false;  // not a member (a join waiting to be taken in)
}

std::optional<TimePoint> EtcdReducer::next_deadline() {
  auto current = view();
  if (!current || !current.value()) return std::nullopt;
  return current.value()->next_deadline();
}

}  // namespace ctrun::rendezvous
