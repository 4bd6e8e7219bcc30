// A small HTTP/1.1 server (Boost.Beast; HTTPS with a TLS context) answering GET and HEAD with
// what a handler says for the request's target: ctrund's --metrics_port (Prometheus text) and
// an agent's TORCHELASTIC_HEALTH_CHECK_PORT. Runs on its owner's io_context; bounded in
// sessions, request size and time, so a scraper or a probe cannot hold its owner up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ctrun/rendezvous/error.h"

namespace boost::asio {
class io_context;
namespace ssl {
class context;
}
}  // namespace boost::asio

namespace ctrun::rendezvous {

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  // The answer to a GET (or HEAD) of `target` (the path with its query).
  using Handler = std::function<HttpReply(std::string_view target)>;

  // Binds and listens at once (an empty host: every interface; port 0: a free one). `name` is
  // the Server header. `tls` set: HTTPS only (ctrund --metrics_tls, with the daemon's own
  // certificate and client CA).
  static Result<std::unique_ptr<HttpServer>> create(
      boost::asio::io_context& io, const std::string& host, std::uint16_t port, std::string name,
      Handler handler, std::shared_ptr<boost::asio::ssl::context> tls = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::uint16_t port() const;
  const std::string& endpoint() const;
  void start();
  void stop();  // closes the listener and every open session; safe to call twice

 private:
  class Impl;
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous
