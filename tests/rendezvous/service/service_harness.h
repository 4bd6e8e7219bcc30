// Drives a Service in memory: connections are numbers, frames are Json, time is a ManualClock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fake_transport.h"
#include "rendezvous/protocol/auth.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/service/service.h"

namespace ctrun::rendezvous::testing {

class ServiceHarness {
 public:
  explicit ServiceHarness(ServiceOptions options = {}) {
    options.random = [this](std::size_t n) {
      // Deterministic but distinct per call, so replayed proofs are tested for real.
      std::string out(n, '\0');
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>(nonce_counter_ * 31 + i);
      ++nonce_counter_;
      return out;
    };
    options.log = [this](const std::string& line) { logs.push_back(line); };
    token = options.token;
    service = std::make_unique<Service>(std::move(options), clock, transport);
  }

  ConnectionId connect(const std::string& host = "10.0.0.1") {
    const ConnectionId id = next_id_++;
    service->on_connect(id, host + ":" + std::to_string(1000 + id));
    return id;
  }

  void send(ConnectionId id, const Json& frame) {
    const std::string bytes = encode_frame(frame);
    service->on_data(id, bytes.data(), bytes.size());
  }
  void send_raw(ConnectionId id, const std::string& bytes) {
    service->on_data(id, bytes.data(), bytes.size());
  }

  // A connection to `job`'s own worker-store port: torch's TCPStore wire from the first byte.
  ConnectionId connect_worker_store(const std::string& job, const std::string& host = "10.0.0.9") {
    const ConnectionId id = next_id_++;
    transport.raw.insert(id);
    service->on_connect(id, host + ":" + std::to_string(1000 + id), job);
    return id;
  }

  // Reads the challenge and says hello for `job`, proving the token when there is one; `extra`
  // fields go into the hello too.
  Json hello(ConnectionId id, const std::string& job, const Json& extra = Json::object()) {
    Json challenge = transport.take(id);
    Json hello{{"op", "hello"}, {"id", 0}, {"version", kProtocolVersion}, {"job", job}};
    for (const auto& [k, v] : extra.items()) hello[k] = v;
    if (token) {
      const auto& nonce = challenge["nonce"].get_binary();
      hello["proof"] =
          to_binary(client_proof(*token, std::string(nonce.begin(), nonce.end()), job));
    }
    send(id, hello);
    return transport.take(id);
  }

  ConnectionId connect_hello(const std::string& job = "job") {
    ConnectionId id = connect();
    Json answer = hello(id, job);
    if (!answer.value("ok", false)) throw std::logic_error("hello refused: " + answer.dump());
    return id;
  }

  // Sends a request and returns the answer, which must come at once.
  Json call(ConnectionId id, Json request) {
    request["id"] = next_request_++;
    send(id, request);
    return transport.take(id);
  }

  ManualClock clock;
  FakeTransport transport;
  std::unique_ptr<Service> service;
  std::vector<std::string> logs;
  std::optional<std::string> token;

 private:
  ConnectionId next_id_ = 1;
  std::uint64_t next_request_ = 100;
  int nonce_counter_ = 0;
};

inline Json join_request(const std::string& node, int min, int max, int local_world_size = 1) {
  return Json{{"op", "join"},
              {"node", node},
              {"host", node + ".host"},
              {"master_port", 29500},
              {"min_nodes", min},
              {"max_nodes", max},
              {"local_world_size", local_world_size}};
}

inline Json with_id(Json request, int id) {
  request["id"] = id;
  return request;
}

inline bool mentions(const std::vector<std::string>& logs, const std::string& text) {
  for (const auto& l : logs) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

inline bool is_error(const Json& frame, const char* code) {
  return frame.contains("error") && frame["error"]["code"] == code;
}

}  // namespace ctrun::rendezvous::testing
