#include "worker_runtime/quorum/proxy_messages.h"

#include <set>

#include "worker_runtime/quorum/quorum_plan.h"

namespace ctrun::worker {

using rendezvous::Error;
using rendezvous::ErrorCode;
using rendezvous::Json;
using rendezvous::Result;

namespace {

const std::set<std::string> kQuorumOps = {"connect", "quorum", "finish"};
const std::set<std::string> kStoreOps = {"set",   "get",  "add",    "compare_set",
                                         "check", "wait", "delete", "num_keys"};

Error bad(const std::string& what) { return Error{ErrorCode::kBadRequest, what}; }

Result<std::string> string_field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || !it->is_string()) {
    return bad(std::string("the request's '") + name + "' must be a string");
  }
  return it->get<std::string>();
}

Result<std::string> bytes_field(const Json& body, const char* name) {
  auto hex = string_field(body, name);
  if (!hex) return hex.error();
  auto bytes = from_hex(hex.value());
  if (!bytes) return bad(std::string("the request's '") + name + "': " + bytes.error().message);
  return bytes;
}

Result<std::int64_t> int_field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || !it->is_number_integer()) {
    return bad(std::string("the request's '") + name + "' must be an integer");
  }
  return it->get<std::int64_t>();
}

Result<std::vector<std::string>> keys_field(const Json& body) {
  auto it = body.find("keys");
  if (it == body.end() || !it->is_array()) return bad("the request's 'keys' must be a list");
  std::vector<std::string> keys;
  for (const auto& k : *it) {
    if (!k.is_string()) return bad("the request's 'keys' must hold strings");
    keys.push_back(k.get<std::string>());
  }
  return keys;
}

// The wait of get/wait: absent or negative waits as long as the store is reachable.
Result<std::optional<rendezvous::Duration>> wait_field(const Json& body) {
  if (!body.contains("timeout_ms")) return std::optional<rendezvous::Duration>();
  auto ms = int_field(body, "timeout_ms");
  if (!ms) return ms.error();
  if (ms.value() < 0) return std::optional<rendezvous::Duration>();
  return std::optional<rendezvous::Duration>(std::chrono::milliseconds(ms.value()));
}

}  // namespace

Result<ProxyRequest> parse_proxy_request(const std::string& line) {
  Json body = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object() || !body.contains("id") ||
      !body["id"].is_number_integer() || !body.contains("op") || !body["op"].is_string()) {
    return bad("a request must be a JSON object with an integer 'id' and a string 'op'");
  }
  ProxyRequest r{body["id"].get<std::int64_t>(), body["op"].get<std::string>(), body};
  if (!kQuorumOps.count(r.op) && !kStoreOps.count(r.op)) return bad("unknown op '" + r.op + "'");
  return r;
}

bool is_store_op(const std::string& op) { return kStoreOps.count(op) > 0; }

std::string proxy_reply(std::int64_t id, Json fields) {
  if (!fields.is_object()) fields = Json::object();
  fields["id"] = id;
  fields["ok"] = true;
  return fields.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string proxy_error(std::int64_t id, const Error& error) {
  Json j = {{"id", id},
            {"ok", false},
            {"code", std::string(rendezvous::error_code_name(error.code))},
            {"error", error.message}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<rendezvous::QuorumConfig> proxy_quorum_config(const Json& body) {
  auto it = body.find("config");
  if (it == body.end() || !it->is_object()) return bad("the request's 'config' must be an object");
  rendezvous::QuorumConfig config;
  auto min = int_field(*it, "min_replicas");
  auto max = int_field(*it, "max_replicas");
  auto join = int_field(*it, "join_timeout_ms");
  auto beat = int_field(*it, "heartbeat_timeout_ms");
  for (const auto* r : {&min, &max, &join, &beat}) {
    if (!*r) return bad("config: " + r->error().message);
  }
  config.min_replicas = static_cast<int>(min.value());
  config.max_replicas = static_cast<int>(max.value());
  config.join_timeout = std::chrono::milliseconds(join.value());
  config.heartbeat_timeout = std::chrono::milliseconds(beat.value());
  if (auto s = rendezvous::validate(config); !s) return s.error();
  return config;
}

Result<Json> proxy_quorum_answer(const rendezvous::QuorumAssignment& a) {
  Json plan = Json::object();
  if (a.finished) {
    plan = {{"rank", nullptr},
            {"size", 0},
            {"step", a.max_step},
            {"trainers", Json::array()},
            {"heal_from", Json::array()}};
  } else {
    auto planned = plan_quorum(a.members, 1);
    if (!planned) return planned.error();
    const QuorumPlan& p = planned.value();
    const auto rank = p.rank_of(a.rank);
    Json heal_from = Json::array();
    for (const auto& from : p.heal_from) {
      heal_from.push_back(from ? Json(*from) : Json(nullptr));
    }
    plan = {{"rank", rank ? Json(*rank) : Json(nullptr)},
            {"size", static_cast<int>(p.trainers.size())},
            {"step", p.step},
            {"trainers", p.trainers},
            {"heal_from", heal_from}};
  }
  return Json{{"quorum", rendezvous::to_json(a)}, {"plan", plan}};
}

Result<Json> answer_store_request(rendezvous::StoreClient& store, const ProxyRequest& r) {
  const Json& b = r.body;
  if (r.op == "num_keys") {
    auto n = store.num_keys();
    if (!n) return n.error();
    return Json{{"count", n.value()}};
  }
  if (r.op == "check" || r.op == "wait") {
    auto keys = keys_field(b);
    if (!keys) return keys.error();
    if (r.op == "check") {
      auto ready = store.check(keys.value());
      if (!ready) return ready.error();
      return Json{{"ready", ready.value()}};
    }
    auto within = wait_field(b);
    if (!within) return within.error();
    if (auto s = store.wait(keys.value(), within.value()); !s) return s.error();
    return Json::object();
  }
  auto key = string_field(b, "key");
  if (!key) return key.error();
  if (r.op == "set") {
    auto value = bytes_field(b, "value");
    if (!value) return value.error();
    if (auto s = store.set(key.value(), value.value()); !s) return s.error();
    return Json::object();
  }
  if (r.op == "get") {
    auto within = wait_field(b);
    if (!within) return within.error();
    auto value = store.get(key.value(), within.value());
    if (!value) return value.error();
    return Json{{"value", to_hex(value.value())}};
  }
  if (r.op == "add") {
    auto delta = int_field(b, "delta");
    if (!delta) return delta.error();
    auto value = store.add(key.value(), delta.value());
    if (!value) return value.error();
    return Json{{"value", value.value()}};
  }
  if (r.op == "compare_set") {
    auto expected = bytes_field(b, "expected");
    if (!expected) return expected.error();
    auto desired = bytes_field(b, "desired");
    if (!desired) return desired.error();
    auto value = store.compare_set(key.value(), expected.value(), desired.value());
    if (!value) return value.error();
    return Json{{"value", to_hex(value.value())}};
  }
  if (r.op == "delete") {
    auto deleted = store.erase(key.value());
    if (!deleted) return deleted.error();
    return Json{{"deleted", deleted.value()}};
  }
  return bad("'" + r.op + "' is not a store op");
}

std::string to_hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Result<std::string> from_hex(const std::string& hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return bad("hex of odd length " + std::to_string(hex.size()));
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]);
    const int lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return bad("not hex at offset " + std::to_string(i));
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace ctrun::worker
