// A Transport that records what the Service sends, decoded, per connection.
#pragma once

#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "ctrun/rendezvous/frame.h"
#include "rendezvous/service/service.h"

namespace ctrun::rendezvous::testing {

class FakeTransport : public Transport {
 public:
  void send(ConnectionId id, std::string bytes) override {
    if (closed.count(id)) throw std::logic_error("send after close");
    if (raw.count(id)) {
      raw_bytes[id] += bytes;
      return;
    }
    auto& decoder = decoders[id];
    decoder.feed(bytes.data(), bytes.size());
    while (true) {
      auto frame = decoder.next();
      if (!frame) throw std::logic_error("service sent an undecodable frame");
      if (!frame.value()) break;
      inbox[id].push_back(std::move(*frame.value()));
    }
    bytes_sent += bytes.size();
  }
  void close(ConnectionId id) override {
    if (closed.count(id)) throw std::logic_error("close twice");
    closed.insert(id);
  }
  Result<std::uint16_t> open_worker_store(const std::string& job) override {
    if (refuse_worker_store) return Error{ErrorCode::kConnection, "every port in use"};
    if (worker_store_ports.count(job)) throw std::logic_error("worker store opened twice");
    return worker_store_ports[job] = next_worker_store_port++;
  }
  void close_worker_store(const std::string& job) override {
    if (!worker_store_ports.erase(job)) throw std::logic_error("closing a port never opened");
    closed_worker_stores.insert(job);
  }

  // Oldest unread frame for a connection; throws when there is none.
  Json take(ConnectionId id) {
    auto& q = inbox[id];
    if (q.empty()) throw std::logic_error("no frame for connection " + std::to_string(id));
    Json j = std::move(q.front());
    q.pop_front();
    return j;
  }
  bool has(ConnectionId id) { return !inbox[id].empty(); }

  // What the connection was sent, undecoded (TCPStore connections), and takes it.
  std::string take_raw(ConnectionId id) { return std::exchange(raw_bytes[id], std::string()); }

  std::set<ConnectionId> raw;  // connections whose bytes are kept as they came, not decoded
  std::map<ConnectionId, std::string> raw_bytes;
  std::map<ConnectionId, FrameDecoder> decoders;
  std::map<ConnectionId, std::deque<Json>> inbox;
  std::set<ConnectionId> closed;
  std::size_t bytes_sent = 0;
  // Worker-store listeners (ServiceOptions::worker_store_per_job): open ones by job.
  std::map<std::string, std::uint16_t> worker_store_ports;
  std::set<std::string> closed_worker_stores;
  std::uint16_t next_worker_store_port = 40000;
  bool refuse_worker_store = false;
};

}  // namespace ctrun::rendezvous::testing
