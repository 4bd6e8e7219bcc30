#include "rendezvous/core/quorum.h"

#include <algorithm>

namespace ctrun::rendezvous {

namespace {

Json member_json(const QuorumMember& m) {
  return {{"replica", m.replica_id}, {"step", m.step}, {"address", m.address}};
}

QuorumMember member_from_json(const Json& j) {
  return {j.at("replica").get<std::string>(), j.at("step").get<std::int64_t>(),
          j.at("address").get<std::string>()};
}

}  // namespace

Quorum::Quorum(QuorumConfig config, const Clock& clock, std::string store_root)
    : config_(std::move(config)), clock_(clock), store_root_(std::move(store_root)) {}

std::vector<QuorumNotice> Quorum::ask(const QuorumMember& member, bool rebuild) {
  if (finished_step_) return {finished_notice(member)};
  rebuild_ = rebuild_ || rebuild;
  last_heard_[member.replica_id] = clock_.now();
  removed_.erase(member.replica_id);
  asks_[member.replica_id] = member;
  if (!first_ask_) first_ask_ = clock_.now();
  return maybe_form();
}

std::vector<QuorumNotice> Quorum::finish(const QuorumMember& member) {
  finished_step_ = std::max(finished_step_.value_or(0), member.step);
  asks_.erase(member.replica_id);
  last_heard_.erase(member.replica_id);
  std::vector<QuorumNotice> out{finished_notice(member)};
  for (const auto& [id, waiting] : asks_) out.push_back(finished_notice(waiting));
  asks_.clear();
  first_ask_.reset();
  return out;
}

QuorumNotice Quorum::finished_notice(const QuorumMember& member) const {
  QuorumAssignment a;
  a.quorum_id = quorum_id_;
  a.members = {member};
  a.max_step = *finished_step_;
  a.finished = true;
  return QuorumNotice{member.replica_id, std::move(a)};
}

void Quorum::heartbeat(const std::string& replica_id) { last_heard_[replica_id] = clock_.now(); }

std::vector<QuorumNotice> Quorum::remove(const std::string& replica_id) {
  asks_.erase(replica_id);
  last_heard_.erase(replica_id);
  removed_.insert(replica_id);
  if (asks_.empty()) first_ask_.reset();
  return maybe_form();
}

std::vector<QuorumNotice> Quorum::tick() { return maybe_form(); }

// A pending ask is proof of life: a replica that waits for its answer cannot send heartbeats,
// and the caller removes it when the connection it asked on closes.
bool Quorum::alive(const std::string& replica_id) const {
  if (asks_.count(replica_id)) return true;
  auto it = last_heard_.find(replica_id);
  return it != last_heard_.end() && clock_.now() - it->second < config_.heartbeat_timeout;
}

std::size_t Quorum::members_asking() const {
  return static_cast<std::size_t>(
      std::count_if(members_.begin(), members_.end(),
                    [this](const QuorumMember& m) { return asks_.count(m.replica_id) != 0; }));
}

bool Quorum::has_majority() const {
  return members_.empty() || 2 * members_asking() > members_.size();
}

// Every replica that asked is alive (alive()): all of asks_ are candidates.
std::vector<QuorumNotice> Quorum::maybe_form() {
  if (asks_.empty()) return {};
  const auto count = static_cast<int>(asks_.size());
  if (count < config_.min_replicas || !has_majority()) return {};
  const bool timed_out = clock_.now() - *first_ask_ >= config_.join_timeout;
  if (members_.empty()) {
    // The first quorum: everyone the job starts with, or whoever came within the join timeout.
    const bool whole = config_.max_replicas > 0 && count >= config_.max_replicas;
    return whole || timed_out ? form() : std::vector<QuorumNotice>{};
  }
  // Every live member of the last quorum asked: no reason to wait.
  const bool all_in = std::all_of(members_.begin(), members_.end(), [&](const QuorumMember& m) {
    return asks_.count(m.replica_id) || removed_.count(m.replica_id) || !alive(m.replica_id);
  });
  return all_in || timed_out ? form() : std::vector<QuorumNotice>{};
}

std::vector<QuorumNotice> Quorum::form() {
  std::vector<QuorumMember> next;
  for (const auto& [id, member] : asks_) next.push_back(member);
  const bool same = next.size() == members_.size() &&
                    std::equal(next.begin(), next.end(), members_.begin(),
                               [](const QuorumMember& a, const QuorumMember& b) {
                                 return a.replica_id == b.replica_id;
                               });
  if (!same || quorum_id_ == 0 || rebuild_) ++quorum_id_;
  ++formations_;
  rebuild_ = false;
  members_ = next;
  asks_.clear();
  removed_.clear();
  first_ask_.reset();

  std::vector<QuorumNotice> out;
  for (const auto& m : members_)
    out.push_back(QuorumNotice{m.replica_id, *assignment(m.replica_id)});
  return out;
}

std::optional<QuorumAssignment> Quorum::assignment(const std::string& replica_id) const {
  const auto me = std::find_if(members_.begin(), members_.end(),
                               [&](const QuorumMember& m) { return m.replica_id == replica_id; });
  if (me == members_.end()) return std::nullopt;
  QuorumAssignment a;
  a.quorum_id = quorum_id_;
  a.members = members_;
  a.rank = static_cast<int>(me - members_.begin());
  for (const auto& m : members_) a.max_step = std::max(a.max_step, m.step);
  a.heal_from = heal_sources(members_)[static_cast<std::size_t>(a.rank)];
  a.store_prefix = store_root_ + std::to_string(quorum_id_) + "/";
  return a;
}

std::vector<std::string> Quorum::known() const {
  std::vector<std::string> out;
  for (const auto& [id, heard] : last_heard_) out.push_back(id);
  return out;
}

Json Quorum::save() const {
  Json members = Json::array();
  for (const auto& m : members_) members.push_back(member_json(m));
  Json asks = Json::array();
  for (const auto& [id, m] : asks_) asks.push_back(member_json(m));
  Json j{{"min_replicas", config_.min_replicas},
         {"max_replicas", config_.max_replicas},
         {"join_timeout_ms", to_millis(config_.join_timeout)},
         {"heartbeat_timeout_ms", to_millis(config_.heartbeat_timeout)},
         {"store_root", store_root_},
         {"quorum_id", quorum_id_},
         {"formations", formations_},
         {"rebuild", rebuild_},
         {"members", std::move(members)},
         {"asks", std::move(asks)},
         {"known", known()},
         {"removed", removed_},
         {"saved_unix_ms", clock_.unix_millis()}};
  if (finished_step_) j["finished_step"] = *finished_step_;
  if (first_ask_) j["first_ask_age_ms"] = to_millis(clock_.now() - *first_ask_);
  return j;
}

Result<std::unique_ptr<Quorum>> Quorum::restore(const Json& j, const Clock& clock) {
  // The record was written by save(); a mismatch means a damaged or foreign state.
  try {
    QuorumConfig config;
    config.min_replicas = j.at("min_replicas").get<int>();
    config.max_replicas = j.at("max_replicas").get<int>();
    config.join_timeout = std::chrono::milliseconds(j.at("join_timeout_ms").get<std::int64_t>());
    config.heartbeat_timeout =
        std::chrono::milliseconds(j.at("heartbeat_timeout_ms").get<std::int64_t>());
    if (auto s = validate(config); !s) return s.error();
    auto q = std::make_unique<Quorum>(config, clock, j.at("store_root").get<std::string>());
    q->quorum_id_ = j.at("quorum_id").get<std::int64_t>();
    q->formations_ = j.at("formations").get<std::int64_t>();
    q->rebuild_ = j.at("rebuild").get<bool>();
    for (const auto& m : j.at("members")) q->members_.push_back(member_from_json(m));
    for (const auto& a : j.at("asks")) {
      auto m = member_from_json(a);
      q->asks_[m.replica_id] = std::move(m);
    }
    const TimePoint now = clock.now();
    for (const auto& id : j.at("known")) q->last_heard_[id.get<std::string>()] = now;
    q->removed_ = j.at("removed").get<std::set<std::string>>();
    if (j.contains("finished_step")) q->finished_step_ = j.at("finished_step").get<std::int64_t>();
    if (j.contains("first_ask_age_ms")) {
      // The time since the writer saved counts too. (Wall clocks of different machines agree
      // only as well as NTP keeps them; a reading from the future counts 0.)
      const auto since_saved = std::max<std::int64_t>(
          0, clock.unix_millis() - j.at("saved_unix_ms").get<std::int64_t>());
      q->first_ask_ = now - std::chrono::milliseconds(j.at("first_ask_age_ms").get<std::int64_t>() +
                                                      since_saved);
    }
    return q;
  } catch (const Json::exception& e) {
    return Error{ErrorCode::kBadRequest, std::string("saved quorum: ") + e.what()};
  }
}

std::optional<TimePoint> Quorum::next_deadline() const {
  if (!first_ask_) return std::nullopt;
  std::optional<TimePoint> due = *first_ask_ + config_.join_timeout;
  // A waited-for member going silent may let the quorum form sooner (times already past are
  // no news).
  const TimePoint now = clock_.now();
  for (const auto& m : members_) {
    auto it = last_heard_.find(m.replica_id);
    if (it == last_heard_.end() || asks_.count(m.replica_id)) continue;
    const TimePoint silent = it->second + config_.heartbeat_timeout;
    if (silent > now && silent < *due) due = silent;
  }
  return due;
}

std::vector<std::string> Quorum::waiting() const {
  std::vector<std::string> out;
  for (const auto& [id, member] : asks_) out.push_back(id);
  return out;
}

std::string Quorum::why_waiting() const {
  if (asks_.empty()) return "";
  if (static_cast<int>(asks_.size()) < config_.min_replicas) {
    return std::to_string(asks_.size()) + " replicas asked, the quorum needs at least " +
           std::to_string(config_.min_replicas);
  }
  if (!has_majority()) {
    return "only " + std::to_string(members_asking()) + " of the last quorum's " +
           std::to_string(members_.size()) +
           " replicas asked: a quorum needs a majority of them (a partition's minority stops)";
  }
  if (members_.empty()) return "gathering the first quorum for the join timeout";
  std::string missing;
  for (const auto& m : members_) {
    if (!removed_.count(m.replica_id) && alive(m.replica_id) && !asks_.count(m.replica_id)) {
      if (!missing.empty()) missing += ", ";
      missing += m.replica_id;
    }
  }
  return "waiting for " + missing + " until the join timeout";
}

Json Quorum::describe() const {
  Json members = Json::array();
  for (const auto& m : members_) members.push_back(member_json(m));
  Json j{{"quorum_id", quorum_id_},
         {"members", std::move(members)},
         {"waiting", waiting()},
         {"why_waiting", why_waiting()}};
  if (finished_step_) j["finished_step"] = *finished_step_;
  return j;
}

}  // namespace ctrun::rendezvous
