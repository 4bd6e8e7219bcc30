#include "rendezvous/etcd/etcd.h"

#include <algorithm>
#include <charconv>
#include <optional>

namespace ctrun::rendezvous::etcd {
namespace {

constexpr const char* kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

Error bad_answer(const std::string& what) {
  return Error{ErrorCode::kInternal, "etcd: unexpected answer: " + what};
}

// An int64 field: etcd writes them as strings, accepts both; absent means 0.
Result<std::int64_t> int_field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::int64_t{0};
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  return bad_answer(std::string("field '") + name + "' is not an integer");
}

Result<std::string> bytes_field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return bad_answer(std::string("field '") + name + "' is not a string");
  return base64_decode(it->get<std::string>());
}

Result<KeyValue> parse_kv(const Json& j) {
  if (!j.is_object()) return bad_answer("a key-value is not an object");
  KeyValue kv;
  auto key = bytes_field(j, "key");
  auto value = bytes_field(j, "value");
  auto create = int_field(j, "create_revision");
  auto mod = int_field(j, "mod_revision");
  auto version = int_field(j, "version");
  auto lease = int_field(j, "lease");
  if (!key) return key.error();
  if (!value) return value.error();
  if (!create) return create.error();
  if (!mod) return mod.error();
  if (!version) return version.error();
  if (!lease) return lease.error();
  kv.key = std::move(key).value();
  kv.value = std::move(value).value();
  kv.create_revision = create.value();
  kv.mod_revision = mod.value();
  kv.version = version.value();
  kv.lease = lease.value();
  return kv;
}

Json operation_json(const Operation& op) {
  switch (op.kind) {
    case Operation::Kind::kPut:
      return Json{{"request_put", put_request(op.key, op.value, op.lease)}};
    case Operation::Kind::kRange: {
      Json range = range_request(op.key, op.range_end, op.limit, op.keys_only);
      if (op.max_mod_revision > 0) range["max_mod_revision"] = std::to_string(op.max_mod_revision);
      return Json{{"request_range", std::move(range)}};
    }
    case Operation::Kind::kDelete:
      return Json{{"request_delete_range", delete_request(op.key, op.range_end)}};
  }
  return Json::object();
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < bytes.size()) {
    const bool two = i + 1 < bytes.size();
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (two ? static_cast<unsigned char>(bytes[i + 1]) << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += two ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(const std::string& text) {
  auto value_of = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0)
    return bad_answer("base64 text of length " + std::to_string(text.size()));
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      v[k] = pad ? -1 : value_of(c);
      if (v[k] < 0) return bad_answer("invalid base64");
    }
    const unsigned n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>((n >> 16) & 255);
    if (pad < 2) out += static_cast<char>((n >> 8) & 255);
    if (pad < 1) out += static_cast<char>(n & 255);
  }
  return out;
}

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key: etcd's "from key to the end"
}

Operation put_op(std::string key, std::string value, std::int64_t lease) {
  Operation op;
  op.kind = Operation::Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

Operation range_op(std::string key, std::string range_end) {
  Operation op;
  op.kind = Operation::Kind::kRange;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

Operation older_keys_op(const std::string& prefix, std::int64_t revision, std::int64_t limit) {
  Operation op = range_op(prefix, prefix_end(prefix));
  op.keys_only = true;
  op.max_mod_revision = std::max<std::int64_t>(1, revision - 1);
  op.limit = limit;
  return op;
}

Operation delete_op(std::string key, std::string range_end) {
  Operation op;
  op.kind = Operation::Kind::kDelete;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  return op;
}

Compare unchanged_since(const std::string& key, std::int64_t mod_revision) {
  return Compare{key, mod_revision == 0 ? Compare::Target::kCreate : Compare::Target::kMod,
                 Compare::Result::kEqual, mod_revision, ""};
}

Json put_request(const std::string& key, const std::string& value, std::int64_t lease) {
  Json j{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) j["lease"] = std::to_string(lease);
  return j;
}

Json range_request(const std::string& key, const std::string& range_end, std::int64_t limit,
                   bool keys_only) {
  Json j{{"key", base64_encode(key)}};
  if (!range_end.empty()) j["range_end"] = base64_encode(range_end);
  if (limit > 0) j["limit"] = std::to_string(limit);
  if (keys_only) j["keys_only"] = true;
  return j;
}

Json delete_request(const std::string& key, const std::string& range_end) {
  Json j{{"key", base64_encode(key)}};
  if (!range_end.empty()) j["range_end"] = base64_encode(range_end);
  return j;
}

Json txn_request(const Txn& txn) {
  static constexpr const char* kTargets[] = {"VERSION", "CREATE", "MOD", "VALUE"};
  static constexpr const char* kResults[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  static constexpr const char* kFields[] = {"version", "create_revision", "mod_revision", "value"};
  Json compare = Json::array();
  for (const auto& c : txn.compare) {
    const int t = static_cast<int>(c.target);
    Json item{{"key", base64_encode(c.key)},
              {"target", kTargets[t]},
              {"result", kResults[static_cast<int>(c.result)]}};
    item[kFields[t]] =
        c.target == Compare::Target::kValue ? base64_encode(c.value) : std::to_string(c.number);
    compare.push_back(std::move(item));
  }
  Json success = Json::array();
  for (const auto& op : txn.success) success.push_back(operation_json(op));
  Json failure = Json::array();
  for (const auto& op : txn.failure) failure.push_back(operation_json(op));
  return Json{{"compare", std::move(compare)},
              {"success", std::move(success)},
              {"failure", std::move(failure)}};
}

Json watch_request(const std::string& key, const std::string& range_end,
                   std::int64_t start_revision, WatchEvents events) {
  Json create{{"key", base64_encode(key)}};
  if (!range_end.empty()) create["range_end"] = base64_encode(range_end);
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  if (events == WatchEvents::kDeletesOnly) create["filters"] = Json::array({"NOPUT"});
  return Json{{"create_request", std::move(create)}};
}

Result<std::int64_t> parse_revision(const Json& answer) {
  if (!answer.is_object()) return bad_answer("not an object");
  auto header = answer.find("header");
  if (header == answer.end() || !header->is_object()) return bad_answer("no header");
  return int_field(*header, "revision");
}

Result<RangeResult> parse_range(const Json& answer) {
  auto revision = parse_revision(answer);
  if (!revision) return revision.error();
  RangeResult r;
  r.revision = revision.value();
  auto count = int_field(answer, "count");
  if (!count) return count.error();
  r.count = count.value();
  r.more = answer.value("more", false);
  if (auto kvs = answer.find("kvs"); kvs != answer.end()) {
    if (!kvs->is_array()) return bad_answer("kvs is not an array");
    for (const auto& item : *kvs) {
      auto kv = parse_kv(item);
      if (!kv) return kv.error();
      r.kvs.push_back(std::move(kv).value());
    }
  }
  return r;
}

Result<TxnResult> parse_txn(const Json& answer) {
  auto revision = parse_revision(answer);
  if (!revision) return revision.error();
  TxnResult t;
  t.revision = revision.value();
  t.succeeded = answer.value("succeeded", false);
  if (auto responses = answer.find("responses"); responses != answer.end()) {
    if (!responses->is_array()) return bad_answer("responses is not an array");
    for (const auto& r : *responses) {
      auto range = r.find("response_range");
      if (range == r.end()) continue;
      // Nested answers carry a header with the revision only.
      auto parsed = parse_range(*range);
      if (!parsed) return parsed.error();
      t.ranges.push_back(std::move(parsed).value());
    }
  }
  return t;
}

Result<std::int64_t> parse_deleted(const Json& answer) {
  if (auto revision = parse_revision(answer); !revision) return revision.error();
  return int_field(answer, "deleted");
}

Result<LeaseGrant> parse_lease_grant(const Json& answer) {
  if (auto revision = parse_revision(answer); !revision) return revision.error();
  auto id = int_field(answer, "ID");
  auto ttl = int_field(answer, "TTL");
  if (!id) return id.error();
  if (!ttl) return ttl.error();
  if (id.value() == 0) return bad_answer("lease grant without an ID");
  return LeaseGrant{id.value(), ttl.value()};
}

Result<std::int64_t> parse_keep_alive(const Json& message) {
  auto result = message.find("result");
  if (result == message.end() || !result->is_object()) {
    if (message.contains("error")) return error_from_answer(503, message.dump());
    return bad_answer("keep-alive message without a result");
  }
  return int_field(*result, "TTL");
}

Result<LeaseTimeToLive> parse_lease_time_to_live(const Json& answer) {
  if (auto revision = parse_revision(answer); !revision) return revision.error();
  auto ttl = int_field(answer, "TTL");
  auto granted = int_field(answer, "grantedTTL");
  if (!ttl) return ttl.error();
  if (!granted) return granted.error();
  return LeaseTimeToLive{ttl.value(), granted.value()};
}

Result<WatchMessage> parse_watch_message(const Json& message) {
  auto result = message.find("result");
  if (result == message.end() || !result->is_object()) {
    if (message.contains("error")) return error_from_answer(503, message.dump());
    return bad_answer("watch message without a result");
  }
  WatchMessage w;
  if (auto header = result->find("header"); header != result->end() && header->is_object()) {
    auto revision = int_field(*header, "revision");
    if (!revision) return revision.error();
    w.revision = revision.value();
  }
  w.created = result->value("created", false);
  w.canceled = result->value("canceled", false);
  auto compact = int_field(*result, "compact_revision");
  if (!compact) return compact.error();
  w.compact_revision = compact.value();
  w.cancel_reason = result->value("cancel_reason", "");
  if (auto events = result->find("events"); events != result->end()) {
    if (!events->is_array()) return bad_answer("events is not an array");
    for (const auto& e : *events) {
      auto kv = e.find("kv");
      if (kv == e.end()) return bad_answer("an event without kv");
      auto parsed = parse_kv(*kv);
      if (!parsed) return parsed.error();
      w.events.push_back(WatchEvent{e.value("type", "PUT") == "DELETE", std::move(parsed).value()});
    }
  }
  return w;
}

Error error_from_answer(int http_status, const std::string& body) {
  const Json j = Json::parse(body, nullptr, false);
  std::string message;
  int code = -1;
  // Fields of the wrong type are ignored, not thrown on: this is a peer's answer.
  auto string_of = [](const Json& o, const char* name) {
    auto it = o.find(name);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto int_of = [](const Json& o, const char* name) {
    auto it = o.find(name);
    return it != o.end() && it->is_number_integer() ? it->get<int>() : -1;
  };
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_object()) {  // a stream's error
      message = string_of(*e, "message");
      code = int_of(*e, "grpc_code");
    } else {
      message = string_of(j, "message");
      if (message.empty()) message = string_of(j, "error");
      code = int_of(j, "code");
    }
  }
  if (message.empty()) {
    message = "HTTP " + std::to_string(http_status) + ": " + body.substr(0, 200);
  }
  // One line, whatever the peer sent.
  for (char& ch : message) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  ErrorCode kind = ErrorCode::kInternal;
  if (code == 5) kind = ErrorCode::kNotFound;
  if (code == 9) kind = ErrorCode::kConflict;
  if (code == 3 || code == 11) kind = ErrorCode::kBadRequest;
  if (code == 14 || http_status == 503) kind = ErrorCode::kConnection;
  return Error{kind, "etcd: " + message};
}

}  // namespace ctrun::rendezvous::etcd
