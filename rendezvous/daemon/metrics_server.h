// ctrund --metrics_port: a small HTTP/1.1 server (Boost.Beast; HTTPS with --metrics_tls)
// answering GET /metrics with the
// Prometheus text that `render` produces. Runs on the daemon's io_context; bounded in sessions,
// request size and time, so a scraper cannot hold the daemon up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace boost::asio {
class io_context;
namespace ssl {
class context;
}
}  // namespace boost::asio

namespace ctrun::rendezvous {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  // Binds and listens at once (an empty host: every interface; port 0: a free one). `tls` set:
  // HTTPS only (ctrund --metrics_tls, with the daemon's own certificate and client CA).
  static Result<std::unique_ptr<MetricsServer>> create(
      boost::asio::io_context& io, const std::string& host, std::uint16_t port, Render render,
      std::shared_ptr<boost::asio::ssl::context> tls = nullptr);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  std::uint16_t port() const;
  const std::string& endpoint() const;
  void start();
  void stop();  // closes the listener and every open session; safe to call twice

 private:
  class Impl;
  explicit MetricsServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous
