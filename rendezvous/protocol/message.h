// Typed access to the fields of a decoded frame, with errors that name the field. Shared by the
// daemon (reading requests) and the client (reading responses and events).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

// The longest timeout a request may carry (timeout_ms and the join's *_ms fields): about 35
// years, so that now + timeout cannot overflow. A longer wait means no deadline.
inline constexpr std::int64_t kMaxTimeoutMillis = std::int64_t{1} << 40;

// Byte strings travel as MessagePack bin; std::string holds them (binary-safe).
Json to_binary(const std::string& bytes);

Result<std::string> get_string(const Json& msg, const char* field);
Result<std::string> get_bytes(const Json& msg, const char* field);
Result<std::int64_t> get_int(const Json& msg, const char* field);
Result<std::vector<std::string>> get_string_list(const Json& msg, const char* field);
Result<std::vector<std::string>> get_bytes_list(const Json& msg, const char* field);
// Optional fields: `fallback` when absent, an error when present with the wrong type.
Result<std::int64_t> get_int_or(const Json& msg, const char* field, std::int64_t fallback);
Result<std::string> get_string_or(const Json& msg, const char* field, std::string fallback);
// An integer field within [lo, hi] ("field 'f' is outside lo..hi" otherwise): required when
// `fallback` is nullopt, else `fallback` when absent.
Result<std::int64_t> get_int_within(const Json& msg, const char* field,
                                    std::optional<std::int64_t> fallback, std::int64_t lo,
                                    std::int64_t hi);

// {"id": id, "error": {"code": name, "message": text}}
Json error_response(std::uint64_t id, const Error& error);
// Turns a response frame into its payload, or into the Error it carries.
Result<Json> response_payload(Json response);

}  // namespace ctrun::rendezvous
