// Errors as values at module boundaries: every fallible public call returns Result<T>.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ctrun::rendezvous {

// Wire-visible error codes: their names (error_code_name) appear in error frames.
enum class ErrorCode {
  kBadFrame,          // undecodable or truncated frame
  kFrameTooLarge,     // length prefix over the limit
  kBadRequest,        // well-formed frame, missing or mistyped field
  kUnknownOp,         // op name the daemon does not serve
  kBadVersion,        // protocol version mismatch
  kAuthFailed,        // missing or wrong token proof
  kNotAuthenticated,  // an op before a successful hello
  kTimeout,           // a wait, get or join ran out of time
  kNotFound,          // key absent and no wait asked for
  kLimit,             // key, value, key count or connection limit exceeded
  kClosed,            // job closed or ended; no new rounds
  kConflict,          // incompatible join (config mismatch, rank taken)
  kConnection,        // client side: could not connect, or connection lost
  kInternal,
};

std::string_view error_code_name(ErrorCode code);
std::optional<ErrorCode> error_code_from_name(std::string_view name);

struct Error {
  ErrorCode code;
  std::string message;
};

// A value or an Error. Deliberately tiny: has_value(), value(), error().
template <typename T>
class [[nodiscard]] Result {
 public:
  // Default-constructed only where a framework demands it (asio's co_spawn): an error.
  Result() : v_(Error{ErrorCode::kInternal, "no result"}) {}
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const Error& error() const { return std::get<1>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Error> v_;
};

// Result<void>: success carries nothing.
struct Ok {};
using Status = Result<Ok>;
inline Status ok_status() { return Ok{}; }

}  // namespace ctrun::rendezvous
