// What a Python worker and its proxy (`ctrun worker-proxy`, worker_proxy.h) say to each other:
// one JSON object per line each way. ctrun_worker.py's FaultTolerance asks the per-step quorum
// and builds each quorum's process group in the job's store through it, since Python speaks
// neither ctrund's framed protocol nor etcd's. Pure: the answers to store requests are computed
// against the StoreClient interface, so they are tested on a fake.
//
// A request: {"id": N, "op": "...", ...}; its answer: {"id": N, "ok": true, ...} or
// {"id": N, "ok": false, "code": "<error code name>", "error": "<one line>"}. Byte values (the
// store's) travel as lowercase hex. The ops (docs/fault_tolerance.md, "Python scripts"):
//   connect   {config: {min_replicas, max_replicas, join_timeout_ms, heartbeat_timeout_ms},
//              timeout_ms}                    -> {}
//   quorum    {committed, rebuild, timeout_ms} -> {quorum: QuorumAssignment's JSON,
//              plan: {rank (null: sits out), size, step, trainers: [member by rank],
//                     heal_from: [rank or null, by rank]}}
//   finish    {step, timeout_ms}              -> {}
//   set {key, value} / get {key, timeout_ms} -> {value} / add {key, delta} -> {value} /
//   compare_set {key, expected, desired} -> {value} / check {keys} -> {ready} /
//   wait {keys, timeout_ms} / delete {key} -> {deleted} / num_keys -> {count}
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/quorum.h"
#include "ctrun/rendezvous/store_client.h"

namespace ctrun::worker {

struct ProxyRequest {
  std::int64_t id = 0;
  std::string op;
  rendezvous::Json body;  // the whole object
};

// An error names what is wrong with the line ("a request must be a JSON object with an integer
// id and a string op", "unknown op 'x'").
rendezvous::Result<ProxyRequest> parse_proxy_request(const std::string& line);

// Whether `op` goes to the store (its own connection and thread) rather than to the quorum.
bool is_store_op(const std::string& op);

// The answer lines, without the newline.
std::string proxy_reply(std::int64_t id, rendezvous::Json fields);
std::string proxy_error(std::int64_t id, const rendezvous::Error& error);

// The quorum settings of a connect request; an error names the field.
rendezvous::Result<rendezvous::QuorumConfig> proxy_quorum_config(const rendezvous::Json& body);

// A quorum's answer for a replica without shard groups: the assignment and its plan
// (quorum_plan.h), so the Python side follows the very rules the C++ runtime does.
rendezvous::Result<rendezvous::Json> proxy_quorum_answer(const rendezvous::QuorumAssignment& a);

// The answer to a store op (is_store_op) against `store`: the reply's fields, or the store's
// error (kBadRequest for a request whose fields are missing or mistyped).
rendezvous::Result<rendezvous::Json> answer_store_request(rendezvous::StoreClient& store,
                                                          const ProxyRequest& request);

std::string to_hex(const std::string& bytes);
rendezvous::Result<std::string> from_hex(const std::string& hex);

}  // namespace ctrun::worker
