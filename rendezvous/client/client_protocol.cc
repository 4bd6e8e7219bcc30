#include "rendezvous/client/client_protocol.h"

#include "rendezvous/protocol/auth.h"

namespace ctrun::rendezvous::client_protocol {
namespace {

Json with_timeout(Json request, std::optional<Duration> timeout) {
  // The daemon takes 0..2^40 ms; a longer wait is the same as no deadline.
  if (timeout && to_millis(*timeout) < kMaxTimeoutMillis) {
    request["timeout_ms"] = std::max<std::int64_t>(0, to_millis(*timeout));
  }
  return request;
}

}  // namespace

Result<Hello> answer_challenge(const Json& challenge, const ClientOptions& options,
                               const std::string& endpoint) {
  if (auto err = response_payload(challenge); !err) return err.error();  // e.g. at its limit
  auto event = get_string(challenge, "event");
  if (!event || event.value() != "challenge") {
    return Error{ErrorCode::kBadFrame, endpoint + " is not a ctrund (no challenge)"};
  }
  auto server_nonce = get_bytes(challenge, "nonce");
  if (!server_nonce) return server_nonce.error();
  auto auth = challenge.find("auth");
  if (auth == challenge.end() || !auth->is_boolean()) {
    return Error{ErrorCode::kBadFrame, endpoint + " sent a challenge without a boolean 'auth'"};
  }
  const bool auth_required = auth->get<bool>();
  if (auth_required && !options.token) {
    return Error{ErrorCode::kAuthFailed,
                 "the rendezvous at " + endpoint + " requires a token and none was given"};
  }
  if (!auth_required && options.token) {
    // A daemon without the token cannot prove itself: it may not be ours.
    return Error{ErrorCode::kAuthFailed,
                 "the rendezvous at " + endpoint + " holds no token but this client has one"};
  }
  Hello hello;
  hello.server_nonce = server_nonce.value();
  hello.request =
      Json{{"op", "hello"}, {"id", 0}, {"version", kProtocolVersion}, {"job", options.job}};
  if (options.want_worker_store) hello.request["worker_store"] = true;
  if (options.token) {
    hello.client_nonce = random_bytes(kNonceBytes);
    hello.request["proof"] =
        to_binary(client_proof(*options.token, hello.server_nonce, options.job));
    hello.request["nonce"] = to_binary(hello.client_nonce);
  }
  return hello;
}

bool retryable(const Error& error) {
  return error.code == ErrorCode::kConnection || error.code == ErrorCode::kLimit ||
         error.code == ErrorCode::kTimeout;
}

ConnectRetry::ConnectRetry(const ClientOptions& options)
    : options_(options),
      deadline_(std::chrono::steady_clock::now() + options.connect_timeout),
      backoff_(options.initial_backoff) {}

Result<Duration> ConnectRetry::next(const Error& failure, const std::string& endpoint) {
  if (!retryable(failure)) return failure;
  if (std::chrono::steady_clock::now() + backoff_ > deadline_) {
    return Error{ErrorCode::kConnection, "could not reach the rendezvous at " + endpoint +
                                             " within " +
                                             std::to_string(to_millis(options_.connect_timeout)) +
                                             " ms: " + failure.message};
  }
  const Duration pause = backoff_;
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
  return pause;
}

Result<Welcome> check_welcome(Json answer, const ClientOptions& options, const Hello& hello,
                              const std::string& endpoint) {
  auto payload = response_payload(std::move(answer));
  if (!payload) return payload.error();
  if (options.token) {
    auto proof = get_bytes(payload.value(), "proof");
    if (!proof ||
        !constant_time_equal(
            proof.value(), server_proof(*options.token, hello.client_nonce, hello.server_nonce))) {
      return Error{ErrorCode::kAuthFailed,
                   "the rendezvous at " + endpoint + " could not prove it holds the token"};
    }
  }
  Welcome welcome;
  auto flag = payload.value().find("worker_store");
  welcome.worker_store = flag != payload.value().end() && flag->is_boolean() && flag->get<bool>();
  auto port = payload.value().find("worker_store_port");
  if (welcome.worker_store && port != payload.value().end()) {
    if (!port->is_number_integer() || port->get<std::int64_t>() < 1 ||
        port->get<std::int64_t>() > 65535) {
      return Error{ErrorCode::kBadRequest, "the rendezvous at " + endpoint +
                                               " named a bad worker store port: " + port->dump()};
    }
    welcome.worker_store_port = static_cast<std::uint16_t>(port->get<std::int64_t>());
  }
  return welcome;
}

Json set(const std::string& key, const std::string& value) {
  return Json{{"op", "set"}, {"key", key}, {"value", to_binary(value)}};
}
Json get(const std::string& key, std::optional<Duration> timeout) {
  return with_timeout(Json{{"op", "get"}, {"key", key}}, timeout);
}
Json add(const std::string& key, std::int64_t delta) {
  return Json{{"op", "add"}, {"key", key}, {"delta", delta}};
}
Json compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return Json{{"op", "compare_set"},
              {"key", key},
              {"expected", to_binary(expected)},
              {"desired", to_binary(desired)}};
}
Json check(const std::vector<std::string>& keys) { return Json{{"op", "check"}, {"keys", keys}}; }
Json wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  return with_timeout(Json{{"op", "wait"}, {"keys", keys}}, timeout);
}
Json erase(const std::string& key) { return Json{{"op", "delete"}, {"key", key}}; }
Json num_keys() { return Json{{"op", "num_keys"}}; }
Json multi_get(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  return with_timeout(Json{{"op", "multi_get"}, {"keys", keys}}, timeout);
}
Json multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  Json list = Json::array();
  for (const auto& v : values) list.push_back(to_binary(v));
  return Json{{"op", "multi_set"}, {"keys", keys}, {"values", std::move(list)}};
}
Json ping() { return Json{{"op", "ping"}}; }
Json keep_alive() { return Json{{"op", "keep_alive"}}; }
Json status() { return Json{{"op", "status"}}; }
Json quorum(const QuorumRequest& request) {
  Json j = to_json(request);
  j["op"] = "quorum";
  return j;
}
Json quorum_heartbeat(const std::string& replica) {
  return Json{{"op", "quorum_heartbeat"}, {"replica", replica}};
}

Status no_payload(const Json&) { return ok_status(); }
Result<std::string> value_bytes(const Json& answer) { return get_bytes(answer, "value"); }
Result<std::int64_t> value_int(const Json& answer) { return get_int(answer, "value"); }
namespace {

Result<bool> get_bool(const Json& answer, const char* field) {
  auto it = answer.find(field);
  if (it == answer.end() || !it->is_boolean()) {
    return Error{ErrorCode::kBadFrame, std::string("answer has no boolean '") + field + "'"};
  }
  return it->get<bool>();
}

}  // namespace

Result<bool> ready(const Json& answer) { return get_bool(answer, "ready"); }
Result<bool> deleted(const Json& answer) { return get_bool(answer, "deleted"); }
Result<std::int64_t> count(const Json& answer) { return get_int(answer, "count"); }
Result<std::vector<std::string>> values(const Json& answer) {
  return get_bytes_list(answer, "values");
}

}  // namespace ctrun::rendezvous::client_protocol
