// Which rendezvous service an agent uses and how to reach it: what make_backend() builds a
// Backend from. Plain data (no Asio), so the launcher's pure parts can decide it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/store_address.h"
#include "rendezvous/base/event_log.h"

namespace ctrun::rendezvous {

namespace etcd {
class Kv;
struct ClientOptions;
}  // namespace etcd

struct BackendSpec {
  enum class Service { kCtrund, kEtcd };
  Service service = Service::kCtrund;
  // ctrund: one endpoint; etcd: every member, tried in turn.
  std::vector<Endpoint> endpoints;
  std::string job = "default";
  std::optional<std::string> token;  // ctrund's shared token
  StoreAccess access;                // TLS; etcd: the user
  std::string etcd_password;         // etcd: the user's, read from access.password_file
  Duration connect_timeout = std::chrono::seconds(60);
  // etcd: the node's lease (keep-alive interval x attempts).
  Duration lease_ttl = std::chrono::seconds(15);
  // etcd: the Rendezvous runs in the agents, so its log lines and events come from them.
  std::function<void(const std::string&)> log;
  EventSink events;
  // etcd: how to reach it, once per connection the backend keeps; absent: the gateway client
  // (tests pass an in-memory etcd).
  std::function<std::unique_ptr<etcd::Kv>(const etcd::ClientOptions&)> connect_kv;
};

}  // namespace ctrun::rendezvous
