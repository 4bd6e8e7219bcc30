// etcd's v3 API as its HTTP/JSON gateway speaks it (facts in docs/etcd_gateway.md): the request
// bodies ctrun sends and the answers it reads, without sockets. Keys and values are bytes on
// our side and base64 on the wire; int64 fields arrive as strings; fields that are zero, false
// or empty are left out by etcd and default here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous::etcd {

std::string base64_encode(const std::string& bytes);
Result<std::string> base64_decode(const std::string& text);

// The range_end that makes a range request cover every key starting with `prefix`.
std::string prefix_end(const std::string& prefix);

// An etcd member's port when --rdzv_endpoint names none (the lists: endpoint.h).
inline constexpr std::uint16_t kDefaultPort = kEtcdDefaultPort;

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

struct RangeResult {
  std::int64_t revision = 0;  // the store's revision when it answered
  std::vector<KeyValue> kvs;
  std::int64_t count = 0;
  bool more = false;
};

// One condition of a transaction: `target` of `key` compared with `number` (versions and
// revisions) or `value`.
struct Compare {
  enum class Target { kVersion, kCreate, kMod, kValue };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kMod;
  Result result = Result::kEqual;
  std::int64_t number = 0;
  std::string value;
};

struct Operation {
  enum class Kind { kPut, kRange, kDelete };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;      // kPut
  std::string range_end;  // kRange, kDelete: empty for the one key
  std::int64_t lease = 0;
  // kRange only: keys without values, only keys last changed at or before max_mod_revision (0:
  // any), at most `limit` of them (0: all) after that filter. etcd's `count` is the range's
  // whole count, the filter not applied (etcd 3.4 counts before it filters): count the keys.
  bool keys_only = false;
  std::int64_t max_mod_revision = 0;
  std::int64_t limit = 0;
};

struct Txn {
  std::vector<Compare> compare;
  std::vector<Operation> success;
  std::vector<Operation> failure;
};

Operation put_op(std::string key, std::string value, std::int64_t lease = 0);
Operation range_op(std::string key, std::string range_end = "");
// The keys (no values) under `prefix` last changed before `revision`, at most `limit`.
Operation older_keys_op(const std::string& prefix, std::int64_t revision, std::int64_t limit);
Operation delete_op(std::string key, std::string range_end = "");
// The condition "`key` is unchanged since `mod_revision`" (0: "`key` does not exist").
Compare unchanged_since(const std::string& key, std::int64_t mod_revision);

struct TxnResult {
  bool succeeded = false;
  std::int64_t revision = 0;
  // The answers of the range operations of the branch taken, in order.
  std::vector<RangeResult> ranges;
};

struct WatchEvent {
  bool deleted = false;
  KeyValue kv;
};

// Which changes a watch hears: every put and deletion, or only deletions (etcd's NOPUT filter,
// applied by etcd: the node keys, whose puts every agent of a large job would hear from all).
enum class WatchEvents { kAll, kDeletesOnly };

// One message of a watch stream.
struct WatchMessage {
  std::int64_t revision = 0;
  bool created = false;
  bool canceled = false;
  std::int64_t compact_revision = 0;  // set when the start revision was compacted away
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};

Json put_request(const std::string& key, const std::string& value, std::int64_t lease = 0);
// `keys_only`: the keys and their metadata (revisions, lease), no values.
Json range_request(const std::string& key, const std::string& range_end = "",
                   std::int64_t limit = 0, bool keys_only = false);
Json delete_request(const std::string& key, const std::string& range_end = "");
Json txn_request(const Txn& txn);
Json watch_request(const std::string& key, const std::string& range_end,
                   std::int64_t start_revision, WatchEvents events = WatchEvents::kAll);

Result<std::int64_t> parse_revision(const Json& answer);  // header.revision
Result<RangeResult> parse_range(const Json& answer);
Result<TxnResult> parse_txn(const Json& answer);
Result<std::int64_t> parse_deleted(const Json& answer);
// lease grant: the id and the TTL granted; keepalive: the TTL left (0: the lease is gone).
struct LeaseGrant {
  std::int64_t id = 0;
  std::int64_t ttl = 0;
};
Result<LeaseGrant> parse_lease_grant(const Json& answer);
Result<std::int64_t> parse_keep_alive(const Json& message);
// lease timetolive: the seconds left (-1 when the lease is gone) and the TTL it was granted.
struct LeaseTimeToLive {
  std::int64_t ttl = 0;
  std::int64_t granted_ttl = 0;
};
Result<LeaseTimeToLive> parse_lease_time_to_live(const Json& answer);
// A watch stream message ({"result": {...}} or a stream error {"error": {...}}).
Result<WatchMessage> parse_watch_message(const Json& message);

// An error answer ({"error", "message", "code"}) as an Error: code 5 -> kNotFound, 9 ->
// kConflict, 3 and 11 -> kBadRequest, 14 -> kConnection (unavailable: try another member),
// others kInternal; the message reads "etcd: <message>".
Error error_from_answer(int http_status, const std::string& body);

}  // namespace ctrun::rendezvous::etcd
