#include "rendezvous/protocol/message.h"

#include <array>
#include <utility>

namespace ctrun::rendezvous {
namespace {

Error bad_field(const char* field, const char* expected) {
  return Error{ErrorCode::kBadRequest,
               std::string("field '") + field + "' missing or not " + expected};
}

constexpr std::array<std::pair<ErrorCode, std::string_view>, 14> kErrorNames{{
    {ErrorCode::kBadFrame, "bad_frame"},
    {ErrorCode::kFrameTooLarge, "frame_too_large"},
    {ErrorCode::kBadRequest, "bad_request"},
    {ErrorCode::kUnknownOp, "unknown_op"},
    {ErrorCode::kBadVersion, "bad_version"},
    {ErrorCode::kAuthFailed, "auth_failed"},
    {ErrorCode::kNotAuthenticated, "not_authenticated"},
    {ErrorCode::kTimeout, "timeout"},
    {ErrorCode::kNotFound, "not_found"},
    {ErrorCode::kLimit, "limit"},
    {ErrorCode::kClosed, "closed"},
    {ErrorCode::kConflict, "conflict"},
    {ErrorCode::kConnection, "connection"},
    {ErrorCode::kInternal, "internal"},
}};

}  // namespace

std::string_view error_code_name(ErrorCode code) {
  for (const auto& [c, name] : kErrorNames) {
    if (c == code) return name;
  }
  return "internal";
}

std::optional<ErrorCode> error_code_from_name(std::string_view name) {
  for (const auto& [c, n] : kErrorNames) {
    if (n == name) return c;
  }
  return std::nullopt;
}

Json to_binary(const std::string& bytes) {
  return Json::binary(std::vector<std::uint8_t>(bytes.begin(), bytes.end()));
}

Result<std::string> get_string(const Json& msg, const char* field) {
  auto it = msg.find(field);
  if (it == msg.end() || !it->is_string()) return bad_field(field, "a string");
  return it->get<std::string>();
}

Result<std::string> get_bytes(const Json& msg, const char* field) {
  auto it = msg.find(field);
  if (it == msg.end()) return bad_field(field, "bytes");
  if (it->is_binary()) {
    const auto& b = it->get_binary();
    return std::string(b.begin(), b.end());
  }
  if (it->is_string()) return it->get<std::string>();  // lenient: str is bytes too
  return bad_field(field, "bytes");
}

Result<std::int64_t> get_int(const Json& msg, const char* field) {
  auto it = msg.find(field);
  if (it == msg.end()) return bad_field(field, "an integer");
  if (it->is_number_unsigned()) {
    const auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(INT64_MAX)) return bad_field(field, "a 64-bit integer");
    return static_cast<std::int64_t>(v);
  }
  if (it->is_number_integer()) return it->get<std::int64_t>();
  return bad_field(field, "an integer");
}

Result<std::int64_t> get_int_or(const Json& msg, const char* field, std::int64_t fallback) {
  if (!msg.contains(field)) return fallback;
  return get_int(msg, field);
}

Result<std::int64_t> get_int_within(const Json& msg, const char* field,
                                    std::optional<std::int64_t> fallback, std::int64_t lo,
                                    std::int64_t hi) {
  auto v = fallback ? get_int_or(msg, field, *fallback) : get_int(msg, field);
  if (!v) return v.error();
  if (v.value() < lo || v.value() > hi) {
    return Error{ErrorCode::kBadRequest, std::string("field '") + field + "' is outside " +
                                             std::to_string(lo) + ".." + std::to_string(hi)};
  }
  return v;
}

Result<std::string> get_string_or(const Json& msg, const char* field, std::string fallback) {
  if (!msg.contains(field)) return fallback;
  return get_string(msg, field);
}

Result<std::vector<std::string>> get_string_list(const Json& msg, const char* field) {
  auto it = msg.find(field);
  if (it == msg.end() || !it->is_array()) return bad_field(field, "a list of strings");
  std::vector<std::string> out;
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (!v.is_string()) return bad_field(field, "a list of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

Result<std::vector<std::string>> get_bytes_list(const Json& msg, const char* field) {
  auto it = msg.find(field);
  if (it == msg.end() || !it->is_array()) return bad_field(field, "a list of bytes");
  std::vector<std::string> out;
  out.reserve(it->size());
  for (const auto& v : *it) {
    if (v.is_binary()) {
      out.emplace_back(v.get_binary().begin(), v.get_binary().end());
    } else if (v.is_string()) {
      out.push_back(v.get<std::string>());
    } else {
      return bad_field(field, "a list of bytes");
    }
  }
  return out;
}

Json error_response(std::uint64_t id, const Error& error) {
  return Json{{"id", id},
              {"error", {{"code", error_code_name(error.code)}, {"message", error.message}}}};
}

Result<Json> response_payload(Json response) {
  auto err = response.find("error");
  if (err == response.end()) return response;
  ErrorCode code = ErrorCode::kInternal;
  std::string message = "malformed error frame";
  if (err->is_object()) {
    auto c = err->find("code");
    if (c != err->end() && c->is_string()) {
      code = error_code_from_name(c->get<std::string>()).value_or(ErrorCode::kInternal);
    }
    auto m = err->find("message");
    if (m != err->end() && m->is_string()) message = m->get<std::string>();
  }
  return Error{code, std::move(message)};
}

}  // namespace ctrun::rendezvous
