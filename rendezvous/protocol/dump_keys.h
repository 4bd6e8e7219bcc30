// The keys of ctrun's hang reports in a job's store (docs/faults.md, "Hang reports"): how an
// agent whose watchdog fired, or `ctrun status --dump`, asks every agent of the job for its
// workers' stacks, and where each answers. Not under a round's prefix: a request outlives the
// round that the hang ends. Private to the tree.
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

// A counter: request n is the value an ADD of 1 returned.
inline constexpr const char* kDumpRequestsKey = "ctrun/dump_requests";
// Request n: {"reason", "by", "at"} (by: "node <group rank>" or "ctrun status"; at: the
// requester's wall clock in ms since the epoch, so that requests made together are joined).
inline constexpr const char* kDumpRequestPrefix = "ctrun/dump_request/";
// A node's answer to request n: {"node", "nodes" (the round's), "host", "ranks":
// [rank_stacks_json], "flight":
// [flight_record_json]}, at kDumpPrefix + n + "/" + its group rank.
inline constexpr const char* kDumpPrefix = "ctrun/dump/";

inline std::string dump_request_key(std::int64_t n) {
  return kDumpRequestPrefix + std::to_string(n);
}
inline std::string dump_answer_key(std::int64_t n, int group_rank) {
  return kDumpPrefix + std::to_string(n) + "/" + std::to_string(group_rank);
}

// Request n's value, written and read here only.
struct DumpRequest {
  std::string reason;
  std::string by;
  std::int64_t at_ms = 0;
};
inline std::string encode_dump_request(const DumpRequest& r) {
  return Json{{"reason", r.reason}, {"by", r.by}, {"at", r.at_ms}}.dump();
}
// When request text was made (its "at"); 0 for text that is no request.
inline std::int64_t dump_request_at(const std::string& text) {
  const Json request = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto it = request.is_object() ? request.find("at") : request.end();
  return it != request.end() && it->is_number_integer() ? it->get<std::int64_t>() : 0;
}

}  // namespace ctrun::rendezvous
