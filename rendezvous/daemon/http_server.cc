#include "rendezvous/daemon/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <chrono>
#include <map>

#include "rendezvous/daemon/listen.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

constexpr std::size_t kMaxSessions = 64;
constexpr std::uint32_t kMaxHeaderBytes = 8 * 1024;
constexpr auto kSessionTimeout = std::chrono::seconds(10);  // per request, first byte to last

http::response<http::string_body> answer(const http::request<http::empty_body>& req,
                                         const std::string& name,
                                         const HttpServer::Handler& handler) {
  http::response<http::string_body> res;
  res.version(req.version());
  res.keep_alive(req.keep_alive());
  res.set(http::field::server, name);
  const bool head = req.method() == http::verb::head;
  if (req.method() != http::verb::get && !head) {
    res.result(http::status::method_not_allowed);
    res.set(http::field::allow, "GET, HEAD");
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = "only GET and HEAD\n";
  } else {
    HttpReply reply = handler(std::string_view(req.target().data(), req.target().size()));
    res.result(static_cast<http::status>(reply.status));
    res.set(http::field::content_type, reply.content_type);
    res.body() = std::move(reply.body);
  }
  res.prepare_payload();
  if (head) res.body().clear();  // Content-Length stays that of the GET answer
  return res;
}

}  // namespace

class HttpServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, std::string name, Handler handler,
       std::shared_ptr<asio::ssl::context> tls)
      : io_(io),
        acceptor_(io),
        name_(std::move(name)),
        handler_(std::move(handler)),
        tls_(std::move(tls)) {}

  Status bind(const std::string& host, std::uint16_t port) {
    if (auto s = listen_on(acceptor_, host, port); !s) return s;
    port_ = acceptor_.local_endpoint().port();
    endpoint_ = endpoint_text(acceptor_.local_endpoint());
    return ok_status();
  }

  void accept() {
    std::weak_ptr<Impl> weak = shared_from_this();
    accept_loop(
        acceptor_,
        [weak] {
          auto self = weak.lock();
          return self && !self->stopped_;
        },
        [weak](tcp::socket socket) {
          auto self = weak.lock();
          boost::system::error_code ignored;
          // A scraper or a probe needs few connections; the owner's own work comes first.
          if (self->sessions_.size() >= kMaxSessions) {
            socket.close(ignored);
          } else {
            self->serve(std::move(socket));
          }
        },
        [](const std::string&) {});
  }

  void serve(tcp::socket socket) {
    const std::uint64_t id = next_id_++;
    auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
    sessions_.emplace(id, stream);
    auto done = [self = shared_from_this(), id](std::exception_ptr) { self->sessions_.erase(id); };
    if (tls_) {
      asio::co_spawn(io_, tls_session(stream), std::move(done));
    } else {
      asio::co_spawn(io_, session(stream), std::move(done));
    }
  }

  // The TLS layer over `stream`, which stays in sessions_ so that stop() can close it.
  asio::awaitable<void> tls_session(std::shared_ptr<beast::tcp_stream> stream) {
    beast::ssl_stream<beast::tcp_stream&> tls(*stream, *tls_);
    stream->expires_after(kSessionTimeout);
    auto [ec] = co_await tls.async_handshake(asio::ssl::stream_base::server,
                                             asio::as_tuple(asio::use_awaitable));
    if (!ec) co_await serve_requests(tls, *stream);
    stream->close();
  }

  asio::awaitable<void> session(std::shared_ptr<beast::tcp_stream> stream) {
    co_await serve_requests(*stream, *stream);
    boost::system::error_code ignored;
    stream->socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream->close();
  }

  // Requests until the client is done, times out or is not speaking HTTP; `tcp` under
  // `stream` carries the timeout.
  template <typename Stream>
  asio::awaitable<void> serve_requests(Stream& stream, beast::tcp_stream& tcp) {
    beast::flat_buffer buffer;
    while (!stopped_) {
      http::request_parser<http::empty_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      tcp.expires_after(kSessionTimeout);
      auto [read_error, n] =
          co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      (void)n;
      if (read_error) break;  // closed, timed out or not HTTP: nothing to answer
      const auto& req = parser.get();
      auto res = answer(req, name_, handler_);
      const bool keep = res.keep_alive();
      auto [write_error, m] =
          co_await http::async_write(stream, res, asio::as_tuple(asio::use_awaitable));
      (void)m;
      if (write_error || !keep) break;
    }
  }

  void stop() {
    if (stopped_) return;
    stopped_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (auto& [id, stream] : sessions_) stream->close();
  }

  asio::io_context& io_;
  tcp::acceptor acceptor_;
  std::string name_;
  Handler handler_;
  std::shared_ptr<asio::ssl::context> tls_;  // set: HTTPS
  std::uint16_t port_ = 0;
  std::string endpoint_;
  std::map<std::uint64_t, std::shared_ptr<beast::tcp_stream>> sessions_;
  std::uint64_t next_id_ = 0;
  bool stopped_ = false;
};

Result<std::unique_ptr<HttpServer>> HttpServer::create(asio::io_context& io,
                                                       const std::string& host, std::uint16_t port,
                                                       std::string name, Handler handler,
                                                       std::shared_ptr<asio::ssl::context> tls) {
  auto impl = std::make_shared<Impl>(io, std::move(name), std::move(handler), std::move(tls));
  if (auto s = impl->bind(host, port); !s) return s.error();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { impl_->stop(); }
std::uint16_t HttpServer::port() const { return impl_->port_; }
const std::string& HttpServer::endpoint() const { return impl_->endpoint_; }
void HttpServer::start() { impl_->accept(); }
void HttpServer::stop() { impl_->stop(); }

}  // namespace ctrun::rendezvous
