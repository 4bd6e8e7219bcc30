// The daemon's network shell: accepts TCP connections on one io_context and moves bytes between
// them and a Service. Embeddable: ctrund runs one, and so does an agent that hosts the rendezvous.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/error.h"
#include "rendezvous/service/service.h"

namespace boost::asio {
class io_context;
namespace ssl {
class context;
}
}  // namespace boost::asio

namespace ctrun::rendezvous {

// Ports to listen on, first..last; 0..0: any free port.
struct PortRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
};
// "auto" (any free port), "30000" or "30000-30099": the text of ctrund --worker_store_ports.
Result<PortRange> parse_port_range(const std::string& text);

struct ServerOptions {
  std::string host;  // empty: every interface (IPv6 and IPv4 where the host has both)
  std::uint16_t port = kDefaultPort;  // 0: an ephemeral port, see Server::port()
  ServiceOptions service;
  // Non-empty: keep every job's store and rendezvous there, restore them at start-up (see
  // state_log.h); service.state is then set by create().
  std::string state_dir;
  Duration tick_interval = std::chrono::milliseconds(50);
  // Per connection: a reader that stalls is cut. Keep it several frames large.
  std::size_t max_pending_write_bytes = 64u << 20;
  // Set: each job's store is also served to torch's TCPStore clients on a port of its own from
  // this range, on `host` (ServiceOptions::worker_store_per_job). Such a port asks for no
  // token: torch's clients have none to give.
  std::optional<PortRange> worker_store_ports;
  // Set: the port speaks TLS only (ctrund --tls_cert; make_server_tls_context). A client that
  // starts in plain is told so in a plain error frame; the worker-store ports stay plain.
  std::shared_ptr<boost::asio::ssl::context> tls;
};

class Server {
 public:
  // Binds and listens at once, so the caller learns a bind error, or the ephemeral port, here.
  static Result<std::unique_ptr<Server>> create(boost::asio::io_context& io, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::uint16_t port() const;
  const std::string& address() const;   // the bound address, e.g. "127.0.0.1"
  const std::string& endpoint() const;  // address and port, e.g. "[::]:29400"
  // Starts accepting and ticking; everything runs on the io_context given to create().
  void start();
  // Stops accepting and closes every connection. Safe to call twice.
  void stop();
  ServiceMetrics metrics() const;

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous
