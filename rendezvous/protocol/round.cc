#include "ctrun/rendezvous/round.h"

#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous {

Status validate(const RendezvousConfig& c) {
  if (c.min_nodes < 1) return Error{ErrorCode::kBadRequest, "min_nodes must be at least 1"};
  if (c.max_nodes < c.min_nodes) {
    return Error{ErrorCode::kBadRequest, "max_nodes (" + std::to_string(c.max_nodes) +
                                             ") is below min_nodes (" +
                                             std::to_string(c.min_nodes) + ")"};
  }
  if (c.join_timeout <= Duration::zero()) {
    return Error{ErrorCode::kBadRequest, "join_timeout must be positive"};
  }
  if (c.last_call_timeout < Duration::zero() || c.close_timeout < Duration::zero()) {
    return Error{ErrorCode::kBadRequest,
                 "last_call_timeout and close_timeout must not be negative"};
  }
  if (c.keep_alive_interval <= Duration::zero() || c.keep_alive_max_attempt < 1) {
    return Error{ErrorCode::kBadRequest,
                 "keep_alive_interval must be positive and keep_alive_max_attempt at least 1"};
  }
  return ok_status();
}

std::string_view job_state_name(JobState state) {
  switch (state) {
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    case JobState::kClosed:
      return "closed";
  }
  return "unknown";
}

std::string round_store_prefix(int generation, int round) {
  return "rdzv/" + std::to_string(generation) + "/" + std::to_string(round) + "/";
}

Json to_json(const RoundAssignment& a) {
  Json j{{"round", a.round},
         {"group_rank", a.group_rank},
         {"group_world_size", a.group_world_size},
         {"rank_offset", a.rank_offset},
         {"world_size", a.world_size},
         {"master_addr", a.master_addr},
         {"master_port", a.master_port},
         {"store_prefix", a.store_prefix}};
  if (a.restart_count >= 0) j["restart_count"] = a.restart_count;
  return j;
}

long long counter_value(const std::string& text, long long otherwise) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return otherwise;
  }
}

Json to_json(const JoinRequest& r) {
  return Json{{"node", r.node.node_id},
              {"host", r.node.host},
              {"local_world_size", r.node.local_world_size},
              {"master_port", r.node.master_port},
              {"requested_rank", r.node.requested_rank},
              {"min_nodes", r.config.min_nodes},
              {"max_nodes", r.config.max_nodes},
              {"join_timeout_ms", to_millis(r.config.join_timeout)},
              {"last_call_timeout_ms", to_millis(r.config.last_call_timeout)},
              {"close_timeout_ms", to_millis(r.config.close_timeout)},
              {"keep_alive_interval_ms", to_millis(r.config.keep_alive_interval)},
              {"keep_alive_max_attempt", r.config.keep_alive_max_attempt}};
}

Result<JoinRequest> join_request_from_json(const Json& j) {
  JoinRequest r;
  auto node = get_string(j, "node");
  if (!node) return node.error();
  auto host = get_string(j, "host");
  if (!host) return host.error();
  r.node.node_id = node.value();
  r.node.host = host.value();
  RendezvousConfig& config = r.config;
  struct IntField {
    const char* name;
    bool required;
    std::int64_t fallback;
    std::int64_t max;
    std::int64_t value = 0;
  };
  IntField fields[] = {
      {"local_world_size", true, 0, 4096},
      {"master_port", false, 0, 65535},
      {"requested_rank", false, -1, 1 << 18},
      {"min_nodes", true, 0, 1 << 18},
      {"max_nodes", true, 0, 1 << 18},
      {"join_timeout_ms", false, to_millis(config.join_timeout), kMaxTimeoutMillis},
      {"last_call_timeout_ms", false, to_millis(config.last_call_timeout), kMaxTimeoutMillis},
      {"close_timeout_ms", false, to_millis(config.close_timeout), kMaxTimeoutMillis},
      {"keep_alive_interval_ms", false, to_millis(config.keep_alive_interval), kMaxTimeoutMillis},
      {"keep_alive_max_attempt", false, config.keep_alive_max_attempt, 1 << 20}};
  for (auto& f : fields) {
    const auto fallback = f.required ? std::nullopt : std::optional<std::int64_t>(f.fallback);
    auto v = get_int_within(j, f.name, fallback, -1, f.max);
    if (!v) return v.error();
    f.value = v.value();
  }
  r.node.local_world_size = static_cast<int>(fields[0].value);
  r.node.master_port = static_cast<int>(fields[1].value);
  r.node.requested_rank = static_cast<int>(fields[2].value);
  config.min_nodes = static_cast<int>(fields[3].value);
  config.max_nodes = static_cast<int>(fields[4].value);
  config.join_timeout = std::chrono::milliseconds(fields[5].value);
  config.last_call_timeout = std::chrono::milliseconds(fields[6].value);
  config.close_timeout = std::chrono::milliseconds(fields[7].value);
  config.keep_alive_interval = std::chrono::milliseconds(fields[8].value);
  config.keep_alive_max_attempt = static_cast<int>(fields[9].value);
  return r;
}

Result<RoundAssignment> round_assignment_from_json(const Json& j) {
  RoundAssignment a;
  for (auto [name, out] :
       {std::pair{"round", &a.round}, std::pair{"group_rank", &a.group_rank},
        std::pair{"group_world_size", &a.group_world_size},
        std::pair{"rank_offset", &a.rank_offset}, std::pair{"world_size", &a.world_size},
        std::pair{"master_port", &a.master_port}}) {
    auto v = get_int(j, name);
    if (!v) return v.error();
    *out = static_cast<int>(v.value());
  }
  auto addr = get_string(j, "master_addr");
  if (!addr) return addr.error();
  a.master_addr = addr.value();
  auto prefix = get_string(j, "store_prefix");
  if (!prefix) return prefix.error();
  a.store_prefix = prefix.value();
  auto restarts = get_int_or(j, "restart_count", -1);
  if (!restarts) return restarts.error();
  a.restart_count = static_cast<int>(restarts.value());
  return a;
}

}  // namespace ctrun::rendezvous
