// What both clients (AsyncClient on an event loop, Client in the caller's thread) say and
// expect, without I/O: the handshake, and each typed operation's request and answer.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/client.h"
#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous::client_protocol {

// The client's half of the handshake: the hello to send after the daemon's challenge.
struct Hello {
  Json request;
  std::string server_nonce;
  std::string client_nonce;
};
Result<Hello> answer_challenge(const Json& challenge, const ClientOptions& options,
                               const std::string& endpoint);
// A refusal (version, token) will not change on retry; a full daemon (kLimit) or a dropped
// connection may clear up.
bool retryable(const Error& error);

// The connect retry policy of both clients: pauses doubling from initial_backoff up to
// max_backoff, for as long as connect_timeout allows.
class ConnectRetry {
 public:
  explicit ConnectRetry(const ClientOptions& options);
  // After a failed attempt: the pause before the next one, or the error to give up with.
  Result<Duration> next(const Error& failure, const std::string& endpoint);

 private:
  const ClientOptions& options_;
  std::chrono::steady_clock::time_point deadline_;
  Duration backoff_;
};
// What the daemon's answer to hello says beyond "welcome".
struct Welcome {
  // The daemon also serves this job's store to torch's TCPStore clients: on its own port (an
  // agent's embedded daemon, ServiceOptions::worker_store_job), or on worker_store_port.
  bool worker_store = false;
  std::optional<std::uint16_t> worker_store_port;
};
// Checks the daemon's answer to hello, including its proof of the token.
Result<Welcome> check_welcome(Json answer, const ClientOptions& options, const Hello& hello,
                              const std::string& endpoint);

Json set(const std::string& key, const std::string& value);
Json get(const std::string& key, std::optional<Duration> timeout);
Json add(const std::string& key, std::int64_t delta);
Json compare_set(const std::string& key, const std::string& expected, const std::string& desired);
Json check(const std::vector<std::string>& keys);
Json wait(const std::vector<std::string>& keys, std::optional<Duration> timeout);
Json erase(const std::string& key);
Json num_keys();
Json multi_get(const std::vector<std::string>& keys, std::optional<Duration> timeout);
Json multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
Json ping();
Json keep_alive();
Json status();
Json quorum(const QuorumRequest& request);
Json quorum_heartbeat(const std::string& replica);

Status no_payload(const Json&);
Result<std::string> value_bytes(const Json& answer);
Result<std::int64_t> value_int(const Json& answer);
Result<bool> ready(const Json& answer);
Result<bool> deleted(const Json& answer);
Result<std::int64_t> count(const Json& answer);
Result<std::vector<std::string>> values(const Json& answer);

}  // namespace ctrun::rendezvous::client_protocol
