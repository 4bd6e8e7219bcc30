#include "ctrun/rendezvous/quorum.h"

#include <algorithm>

#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous {

namespace {

Error bad(const std::string& what) { return Error{ErrorCode::kBadRequest, what}; }

}  // namespace

Status validate(const QuorumConfig& c) {
  if (c.min_replicas < 1) {
    return bad("quorum: min_replicas must be at least 1, got " + std::to_string(c.min_replicas));
  }
  if (c.max_replicas != 0 && c.max_replicas < c.min_replicas) {
    return bad("quorum: max_replicas (" + std::to_string(c.max_replicas) +
               ") is below min_replicas (" + std::to_string(c.min_replicas) + ")");
  }
  if (c.join_timeout <= Duration::zero() || c.heartbeat_timeout <= Duration::zero()) {
    return bad("quorum: the join and heartbeat timeouts must be positive");
  }
  return ok_status();
}

Json to_json(const QuorumAssignment& a) {
  Json members = Json::array();
  for (const auto& m : a.members) {
    members.push_back({{"replica", m.replica_id}, {"step", m.step}, {"address", m.address}});
  }
  Json j{{"quorum_id", a.quorum_id},
         {"members", std::move(members)},
         {"rank", a.rank},
         {"max_step", a.max_step},
         {"store_prefix", a.store_prefix}};
  if (a.heal_from) j["heal_from"] = *a.heal_from;
  if (a.finished) j["finished"] = true;
  return j;
}

Result<QuorumAssignment> quorum_assignment_from_json(const Json& j) {
  if (!j.is_object()) return bad("quorum answer: not an object");
  auto integer = [&](const char* field) -> Result<std::int64_t> {
    auto it = j.find(field);
    if (it == j.end() || !it->is_number_integer()) {
      return bad(std::string("quorum answer: '") + field + "' is not an integer");
    }
    return it->get<std::int64_t>();
  };
  QuorumAssignment a;
  auto id = integer("quorum_id");
  if (!id) return id.error();
  a.quorum_id = id.value();
  auto rank = integer("rank");
  if (!rank) return rank.error();
  auto max_step = integer("max_step");
  if (!max_step) return max_step.error();
  a.max_step = max_step.value();
  auto prefix = j.find("store_prefix");
  if (prefix == j.end() || !prefix->is_string()) {
    return bad("quorum answer: 'store_prefix' is not a string");
  }
  a.store_prefix = prefix->get<std::string>();
  auto members = j.find("members");
  if (members == j.end() || !members->is_array() || members->empty()) {
    return bad("quorum answer: 'members' is not a non-empty array");
  }
  for (const auto& m : *members) {
    if (!m.is_object() || !m.contains("replica") || !m["replica"].is_string() ||
        !m.contains("step") || !m["step"].is_number_integer() || !m.contains("address") ||
        !m["address"].is_string()) {
      return bad("quorum answer: a member is not {replica, step, address}");
    }
    a.members.push_back(QuorumMember{m["replica"].get<std::string>(), m["step"].get<std::int64_t>(),
                                     m["address"].get<std::string>()});
  }
  const auto size = static_cast<std::int64_t>(a.members.size());
  if (rank.value() < 0 || rank.value() >= size) {
    return bad("quorum answer: 'rank' " + std::to_string(rank.value()) + " is not a member");
  }
  a.rank = static_cast<int>(rank.value());
  if (auto heal = j.find("heal_from"); heal != j.end()) {
    if (!heal->is_number_integer() || heal->get<std::int64_t>() < 0 ||
        heal->get<std::int64_t>() >= size) {
      return bad("quorum answer: 'heal_from' is not a member");
    }
    a.heal_from = static_cast<int>(heal->get<std::int64_t>());
  }
  if (auto finished = j.find("finished"); finished != j.end()) {
    if (!finished->is_boolean()) return bad("quorum answer: 'finished' is not true or false");
    a.finished = finished->get<bool>();
  }
  return a;
}

Json to_json(const QuorumRequest& r) {
  return Json{{"replica", r.member.replica_id},
              {"step", r.member.step},
              {"address", r.member.address},
              {"min_replicas", r.config.min_replicas},
              {"max_replicas", r.config.max_replicas},
              {"join_timeout_ms", to_millis(r.config.join_timeout)},
              {"heartbeat_timeout_ms", to_millis(r.config.heartbeat_timeout)},
              {"rebuild", r.rebuild},
              {"finished", r.finished}};
}

Result<QuorumRequest> quorum_request_from_json(const Json& j) {
  QuorumRequest r;
  auto replica = get_string(j, "replica");
  if (!replica) return replica.error();
  auto address = get_string_or(j, "address", "");
  if (!address) return address.error();
  if (replica.value().empty() || replica.value().size() > 256 || address.value().size() > 256) {
    return bad("field 'replica' must be 1..256 bytes and 'address' at most 256");
  }
  r.member.replica_id = replica.value();
  r.member.address = address.value();
  struct IntField {
    const char* name;
    std::optional<std::int64_t> fallback;  // nullopt: required
    std::int64_t min;
    std::int64_t max;
    std::int64_t value = 0;
  };
  IntField fields[] = {
      {"step", std::nullopt, 0, std::int64_t{1} << 62},
      {"min_replicas", r.config.min_replicas, 1, 1 << 20},
      {"max_replicas", r.config.max_replicas, 0, 1 << 20},
      {"join_timeout_ms", to_millis(r.config.join_timeout), 1, kMaxTimeoutMillis},
      {"heartbeat_timeout_ms", to_millis(r.config.heartbeat_timeout), 1, kMaxTimeoutMillis}};
  for (auto& f : fields) {
    auto v = get_int_within(j, f.name, f.fallback, f.min, f.max);
    if (!v) return v.error();
    f.value = v.value();
  }
  r.member.step = fields[0].value;
  r.config.min_replicas = static_cast<int>(fields[1].value);
  r.config.max_replicas = static_cast<int>(fields[2].value);
  r.config.join_timeout = std::chrono::milliseconds(fields[3].value);
  r.config.heartbeat_timeout = std::chrono::milliseconds(fields[4].value);
  for (auto [name, flag] : {std::pair{"rebuild", &r.rebuild}, std::pair{"finished", &r.finished}}) {
    if (auto it = j.find(name); it != j.end()) {
      if (!it->is_boolean()) return bad(std::string("field '") + name + "' must be true or false");
      *flag = it->get<bool>();
    }
  }
  return r;
}

std::vector<std::optional<int>> heal_sources(const std::vector<QuorumMember>& members) {
  std::int64_t max_step = 0;
  for (const auto& m : members) max_step = std::max(max_step, m.step);
  std::vector<int> up_to_date;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i].step == max_step) up_to_date.push_back(static_cast<int>(i));
  }
  std::vector<std::optional<int>> sources(members.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i].step < max_step) sources[i] = up_to_date[next++ % up_to_date.size()];
  }
  return sources;
}

}  // namespace ctrun::rendezvous
