#include "rendezvous/etcd/etcd_client.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "rendezvous/tls/tls_context.h"

namespace ctrun::rendezvous::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

constexpr std::size_t kMaxIdleConnections = 4;
constexpr std::uint32_t kMaxAnswerBytes = 64u << 20;

constexpr const char* kAuthenticatePath = "/v3/auth/authenticate";

// One connection to a member: TLS over TCP when the client speaks https, else the TCP stream
// under it alone.
struct Connection {
  Connection(asio::io_context& io, asio::ssl::context& context, bool use_tls,
             std::size_t endpoint_index)
      : stream(io, context), tls(use_tls), endpoint(endpoint_index) {}
  beast::ssl_stream<beast::tcp_stream> stream;
  bool tls;
  std::size_t endpoint;
  beast::flat_buffer buffer;
  beast::tcp_stream& tcp() { return stream.next_layer(); }
};

// `op` on the connection's byte stream (TLS or plain): Beast's operations are templates on the
// stream, and return the same awaitable either way.
template <class Op>
auto on_stream(Connection& c, Op&& op) {
  return c.tls ? op(c.stream) : op(c.stream.next_layer());
}

std::string where(const Endpoint& ep) { return format_endpoint(ep); }

Error connection_error(const Endpoint& ep, const std::string& what) {
  return Error{ErrorCode::kConnection, "etcd at " + where(ep) + ": " + what};
}

http::request<http::string_body> post(const Endpoint& ep, const std::string& path, std::string body,
                                      const std::string& token) {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, where(ep));
  // etcd's gateway takes the auth token as it is, without a scheme.
  if (!token.empty()) req.set(http::field::authorization, token);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

}  // namespace

class Client::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, ClientOptions options) : io_(io), options_(std::move(options)) {
    if (options_.tls) {
      auto context = make_client_tls_context(*options_.tls);
      if (context) {
        context_ = std::move(context).value();
      } else {
        setup_error_ = Error{ErrorCode::kBadRequest, "etcd over TLS: " + context.error().message};
      }
    }
    if (!context_) context_ = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  }

  // One try on one endpoint: the answer, or an error saying whether another try may help.
  struct Attempt {
    bool retry = false;  // connection trouble or 503: another endpoint may answer
    Result<Json> answer;
  };

  Task<Result<std::unique_ptr<Connection>>> open(std::size_t index,
                                                 std::chrono::steady_clock::time_point until) {
    const Endpoint& ep = options_.endpoints[index];
    tcp::resolver resolver(io_);
    auto [resolve_error, found] = co_await resolver.async_resolve(
        ep.host, std::to_string(ep.port), asio::as_tuple(asio::use_awaitable));
    if (resolve_error) co_return connection_error(ep, resolve_error.message());
    auto c = std::make_unique<Connection>(io_, *context_, options_.tls.has_value(), index);
    c->tcp().expires_at(until);
    auto [connect_error, at] =
        co_await c->tcp().async_connect(found, asio::as_tuple(asio::use_awaitable));
    (void)at;
    if (connect_error) {
      co_return connection_error(ep, connect_error == beast::error::timeout
                                         ? std::string("connect timed out")
                                         : connect_error.message());
    }
    c->tcp().socket().set_option(tcp::no_delay(true));
    if (c->tls) {
      expect_server_name(c->stream.native_handle(), ep.host);
      auto [handshake_error] = co_await c->stream.async_handshake(
          asio::ssl::stream_base::client, asio::as_tuple(asio::use_awaitable));
      if (handshake_error) {
        // A certificate that does not verify will not on another try: said at once.
        const bool timed_out = handshake_error == beast::error::timeout;
        co_return Error{
            timed_out ? ErrorCode::kConnection : ErrorCode::kAuthFailed,
            "etcd at " + where(ep) + ": " +
                (timed_out ? std::string("TLS handshake timed out")
                           : handshake_failure(c->stream.native_handle(), handshake_error))};
      }
    }
    co_return std::move(c);
  }

  Task<Attempt> attempt(std::size_t index, const std::string& path, const std::string& body,
                        std::chrono::steady_clock::time_point until) {
    const Endpoint& ep = options_.endpoints[index];
    // A kept-alive connection may have been closed by etcd meanwhile: one fresh try then.
    for (int pass = 0; pass < 2; ++pass) {
      std::unique_ptr<Connection> c = take_idle(index);
      const bool reused = c != nullptr;
      if (!c) {
        auto opened = co_await open(index, until);
        if (!opened) {
          co_return Attempt{opened.error().code != ErrorCode::kAuthFailed, opened.error()};
        }
        c = std::move(opened).value();
      }
      auto req = post(ep, path, body, path == kAuthenticatePath ? std::string() : token_);
      c->tcp().expires_at(until);
      auto [write_error, written] = co_await on_stream(*c, [&](auto& stream) {
        return http::async_write(stream, req, asio::as_tuple(asio::use_awaitable));
      });
      (void)written;
      http::response_parser<http::string_body> parser;
      parser.body_limit(kMaxAnswerBytes);
      boost::system::error_code read_error = write_error;
      if (!write_error) {
        auto [e, n] = co_await on_stream(*c, [&](auto& stream) {
          return http::async_read(stream, c->buffer, parser, asio::as_tuple(asio::use_awaitable));
        });
        (void)n;
        read_error = e;
      }
      if (read_error) {
        if (reused && read_error != beast::error::timeout && pass == 0) continue;
        if (c->tls && read_error.category() == asio::error::get_ssl_category()) {
          // Under TLS 1.3 the server judges the client's certificate after the handshake:
          // its refusal comes with the first answer.
          co_return Attempt{false,
                            Error{ErrorCode::kAuthFailed,
                                  "etcd at " + where(ep) + ": " +
                                      handshake_failure(c->stream.native_handle(), read_error)}};
        }
        std::string what = read_error == beast::error::timeout ? std::string("no answer in time")
                                                               : read_error.message();
        if (!c->tls && !reused && read_error == http::error::end_of_stream) {
          what +=
              " (closed at the first request: if it serves TLS, give https:// endpoints or "
              "--rdzv_conf protocol=https)";
        }
        co_return Attempt{true, connection_error(ep, what)};
      }
      auto res = parser.release();
      if (res.keep_alive()) give_back(std::move(c));
      const int status = res.result_int();
      if (status == 503) co_return Attempt{true, error_from_answer(status, res.body())};
      if (status != 200) co_return Attempt{false, answer_error(ep, status, res.body())};
      // Streaming endpoints (lease keepalive) wrap their one message in a line of its own.
      Json answer = Json::parse(res.body(), nullptr, false);
      if (answer.is_discarded()) {
        co_return Attempt{false, Error{ErrorCode::kInternal,
                                       "etcd at " + where(ep) +
                                           ": answer is not JSON: " + res.body().substr(0, 200)}};
      }
      preferred_ = index;
      co_return Attempt{false, std::move(answer)};
    }
    co_return Attempt{true, connection_error(ep, "connection lost")};
  }

  Task<Result<Json>> call(std::string path, Json body, std::optional<Duration> within = {},
                          std::function<void(const Error&)> on_retry = {}) {
    auto self = shared_from_this();  // the Client may be destroyed while this call waits
    if (options_.endpoints.empty()) {
      co_return Error{ErrorCode::kBadRequest, "etcd: no endpoint given"};
    }
    if (setup_error_) co_return *setup_error_;
    if (!options_.user.empty() && token_.empty() && path != kAuthenticatePath) {
      if (auto s = co_await authenticate(within); !s) co_return s.error();
    }
    bool authenticated_again = false;
    const std::string text = body.dump();
    const auto deadline =
        std::chrono::steady_clock::now() + within.value_or(options_.request_timeout);
    auto backoff = std::chrono::milliseconds(50);
    Error last{ErrorCode::kConnection, "etcd: no endpoint answered"};
    std::size_t index = preferred_;
    while (true) {
      for (std::size_t tried = 0; tried < options_.endpoints.size(); ++tried) {
        const auto now = std::chrono::steady_clock::now();
        if (closed_) co_return Error{ErrorCode::kClosed, "etcd: client closed"};
        if (now >= deadline) co_return last;
        const auto until = std::min(deadline, now + options_.attempt_timeout);
        Attempt a = co_await attempt(index, path, text, until);
        if (!a.retry && !a.answer && token_expired(a.answer.error()) && !authenticated_again &&
            path != kAuthenticatePath) {
          // The token ran out (etcd's --auth-token-ttl) or the member restarted: a new one, and
          // the same request again.
          authenticated_again = true;
          token_.clear();
          if (auto s = co_await authenticate(within); !s) co_return s.error();
          continue;
        }
        if (!a.retry) co_return std::move(a.answer);
        last = a.answer.error();
        if (on_retry) on_retry(last);
        index = (index + 1) % options_.endpoints.size();
      }
      // Every member refused: wait a little (a leader election, a restart) and go round again.
      asio::steady_timer pause(io_, backoff);
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
  }

  Task<Status> watch(std::string key, std::string range_end, std::int64_t start_revision,
                     std::function<void(const WatchMessage&)> on_message, WatchEvents events) {
    auto self = shared_from_this();
    const std::string body = watch_request(key, range_end, start_revision, events).dump();
    Error last{ErrorCode::kConnection, "etcd: no endpoint answered"};
    for (std::size_t tried = 0; tried < options_.endpoints.size(); ++tried) {
      const std::size_t index = (preferred_ + tried) % options_.endpoints.size();
      const Endpoint& ep = options_.endpoints[index];
      auto opened =
          co_await open(index, std::chrono::steady_clock::now() + options_.attempt_timeout);
      if (!opened) {
        last = opened.error();
        continue;
      }
      if (closed_) co_return ok_status();
      std::shared_ptr<Connection> c = std::move(opened).value();
      watches_.insert(c);
      if (!options_.user.empty() && token_.empty()) {
        if (auto s = co_await authenticate(std::nullopt); !s) co_return s.error();
      }
      auto req = post(ep, "/v3/watch", body, token_);
      c->tcp().expires_at(std::chrono::steady_clock::now() + options_.attempt_timeout);
      auto [write_error, written] = co_await on_stream(*c, [&](auto& stream) {
        return http::async_write(stream, req, asio::as_tuple(asio::use_awaitable));
      });
      (void)written;
      if (write_error) {
        if (watches_.erase(c) == 0) co_return ok_status();  // cancelled meanwhile
        last = connection_error(ep, write_error.message());
        continue;
      }
      // Messages arrive as chunks of newline-ended JSON; a chunk need not hold whole lines.
      std::string pending;
      std::optional<Error> stream_error;
      http::response_parser<http::string_body> parser;
      parser.body_limit(boost::none);
      auto on_chunk = [&](std::uint64_t, beast::string_view data, boost::system::error_code& ec) {
        pending.append(data.data(), data.size());
        std::size_t newline;
        while ((newline = pending.find('\n')) != std::string::npos) {
          const std::string line = pending.substr(0, newline);
          pending.erase(0, newline + 1);
          const Json j = Json::parse(line, nullptr, false);
          auto message = j.is_discarded()
                             ? Result<WatchMessage>(
                                   Error{ErrorCode::kInternal, "etcd: watch message is not JSON"})
                             : parse_watch_message(j);
          if (message && message.value().canceled) {
            // A compacted start revision, or etcd's own cancel: the stream stays open but
            // will say nothing more.
            const WatchMessage& m = message.value();
            stream_error = Error{
                m.compact_revision ? ErrorCode::kNotFound : ErrorCode::kClosed,
                "etcd: watch canceled" +
                    (m.compact_revision
                         ? ": revisions before " + std::to_string(m.compact_revision) +
                               " were compacted"
                         : (m.cancel_reason.empty() ? std::string() : ": " + m.cancel_reason))};
          } else if (!message) {
            stream_error = message.error();
          } else {
            on_message(message.value());
          }
          if (stream_error) {
            ec = asio::error::operation_aborted;  // ends the read
            return std::size_t{0};
          }
        }
        return data.size();
      };
      parser.on_chunk_body(on_chunk);
      // The answer's header must come in time; after it, a quiet watch is a healthy one.
      auto [header_error, h] = co_await on_stream(*c, [&](auto& stream) {
        return http::async_read_header(stream, c->buffer, parser,
                                       asio::as_tuple(asio::use_awaitable));
      });
      (void)h;
      boost::system::error_code read_error = header_error;
      if (!header_error) {
        c->tcp().expires_never();
        auto [e, n] = co_await on_stream(*c, [&](auto& stream) {
          return http::async_read(stream, c->buffer, parser, asio::as_tuple(asio::use_awaitable));
        });
        (void)n;
        read_error = e;
      }
      const bool cancelled = watches_.erase(c) == 0;
      if (cancelled) co_return ok_status();
      if (stream_error) {
        if (token_expired(*stream_error)) token_.clear();  // the next watch asks for a new one
        co_return *stream_error;
      }
      if (parser.is_header_done() && parser.get().result_int() != 200) {
        if (token_expired(error_from_answer(parser.get().result_int(), parser.get().body()))) {
          token_.clear();  // the next watch asks for a new one
        }
        co_return answer_error(ep, parser.get().result_int(), parser.get().body());
      }
      co_return connection_error(
          ep, "watch stream ended" + (read_error ? ": " + read_error.message() : std::string()));
    }
    co_return last;
  }

  void cancel_watches() {
    auto all = std::move(watches_);
    watches_.clear();
    for (const auto& c : all) c->tcp().close();
  }

  void close_all() {
    closed_ = true;
    cancel_watches();
    idle_.clear();
  }

 private:
  // etcd's auth: a token for the user, kept in token_. Errors say the user, never the password.
  Task<Status> authenticate(std::optional<Duration> within) {
    auto answer = co_await call(kAuthenticatePath, authenticate_request(), within);
    if (!answer) {
      std::string message = answer.error().message;
      co_return Error{answer.error().code == ErrorCode::kConnection ? ErrorCode::kConnection
                                                                    : ErrorCode::kAuthFailed,
                      "etcd: user '" + options_.user + "': " + strip_prefix(message)};
    }
    auto token = answer.value().find("token");
    if (token == answer.value().end() || !token->is_string() || token->get<std::string>().empty()) {
      co_return Error{ErrorCode::kAuthFailed,
                      "etcd: user '" + options_.user + "': no token in etcd's answer"};
    }
    token_ = token->get<std::string>();
    co_return ok_status();
  }

  // (Built outside the coroutine: g++ 12 miscompiles braced initializer lists inside one.)
  Json authenticate_request() const {
    return Json{{"name", options_.user}, {"password", options_.password}};
  }

  static bool token_expired(const Error& e) {
    return e.message.find("invalid auth token") != std::string::npos;
  }
  static std::string strip_prefix(std::string message) {
    if (message.rfind("etcd: ", 0) == 0) message.erase(0, 6);
    return message;
  }

  // A non-200 answer as an error, with what to do where the cause is the client's setup.
  Error answer_error(const Endpoint& ep, int status, const std::string& body) const {
    Error e = error_from_answer(status, body);
    if (body.find("Client sent an HTTP request to an HTTPS server") != std::string::npos) {
      e.code = ErrorCode::kBadRequest;
      e.message = "etcd at " + where(ep) +
                  ": it speaks TLS: give https:// endpoints (or --rdzv_conf protocol=https)";
    } else if (e.message.find("user name is empty") != std::string::npos) {
      e.code = ErrorCode::kAuthFailed;
      e.message = "etcd at " + where(ep) +
                  ": auth is enabled there: give --rdzv_conf user=NAME,password_file=FILE (" +
                  strip_prefix(e.message) + ")";
    } else if (e.message.find("permission denied") != std::string::npos && !options_.user.empty()) {
      e.code = ErrorCode::kAuthFailed;
      e.message = "etcd: user '" + options_.user +
                  "': permission denied (its roles must grant read and write on the job's "
                  "keys)";
    }
    return e;
  }

  std::unique_ptr<Connection> take_idle(std::size_t index) {
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if ((*it)->endpoint == index) {
        auto c = std::move(*it);
        idle_.erase(it);
        return c;
      }
    }
    return nullptr;
  }
  void give_back(std::unique_ptr<Connection> c) {
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(c));
  }

  asio::io_context& io_;
  ClientOptions options_;
  std::shared_ptr<asio::ssl::context> context_;  // the TLS settings (unused for plain http)
  std::optional<Error> setup_error_;             // the TLS files could not be used
  std::string token_;                            // etcd auth's, for options_.user
  std::vector<std::unique_ptr<Connection>> idle_;
  std::set<std::shared_ptr<Connection>> watches_;
  std::size_t preferred_ = 0;  // the endpoint that answered last
  bool closed_ = false;        // the Client is gone: calls still in flight end at their next step
};

Result<ClientOptions> with_access(ClientOptions options, const StoreAccess& access) {
  options.tls = access.tls;
  options.user = access.user;
  if (access.user.empty()) return options;
  if (access.password_file.empty()) {
    return Error{ErrorCode::kBadRequest,
                 "etcd: user '" + access.user + "' needs --rdzv_conf password_file=FILE"};
  }
  std::ifstream in(access.password_file);
  if (!in) {
    return Error{ErrorCode::kBadRequest,
                 "etcd: password_file '" + access.password_file + "': " + std::strerror(errno)};
  }
  std::getline(in, options.password);
  if (!options.password.empty() && options.password.back() == '\r') options.password.pop_back();
  if (options.password.empty()) {
    return Error{ErrorCode::kBadRequest,
                 "etcd: password_file '" + access.password_file + "' holds no password"};
  }
  return options;
}

Client::Client(asio::io_context& io, ClientOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {}
Client::~Client() { impl_->close_all(); }

Task<Result<Json>> Client::call(std::string path, Json body) {
  co_return co_await impl_->call(path, body);
}

Task<Result<std::int64_t>> Client::put(std::string key, std::string value, std::int64_t lease) {
  const Json body = put_request(key, value, lease);
  auto answer = co_await impl_->call("/v3/kv/put", body);
  if (!answer) co_return answer.error();
  co_return parse_revision(answer.value());
}

Task<Result<RangeResult>> Client::range(std::string key, std::string range_end, std::int64_t limit,
                                        bool keys_only) {
  const Json body = range_request(key, range_end, limit, keys_only);
  auto answer = co_await impl_->call("/v3/kv/range", body);
  if (!answer) co_return answer.error();
  co_return parse_range(answer.value());
}

Task<Result<TxnResult>> Client::txn(Txn txn) {
  const Json body = txn_request(txn);
  auto answer = co_await impl_->call("/v3/kv/txn", body);
  if (!answer) co_return answer.error();
  co_return parse_txn(answer.value());
}

Task<Result<std::int64_t>> Client::erase(std::string key, std::string range_end) {
  const Json body = delete_request(key, range_end);
  auto answer = co_await impl_->call("/v3/kv/deleterange", body);
  if (!answer) co_return answer.error();
  co_return parse_deleted(answer.value());
}

Task<Result<LeaseGrant>> Client::grant(std::int64_t ttl_seconds, std::optional<Duration> within,
                                       std::function<void(const Error&)> on_retry) {
  Json body = Json::object();
  body["TTL"] = std::to_string(ttl_seconds);
  auto answer = co_await impl_->call("/v3/lease/grant", body, within, std::move(on_retry));
  if (!answer) co_return answer.error();
  co_return parse_lease_grant(answer.value());
}

Task<Result<std::int64_t>> Client::keep_alive(std::int64_t lease) {
  Json body = Json::object();
  body["ID"] = std::to_string(lease);
  auto answer = co_await impl_->call("/v3/lease/keepalive", body);
  if (!answer) co_return answer.error();
  co_return parse_keep_alive(answer.value());
}

Task<Status> Client::revoke(std::int64_t lease) {
  Json body = Json::object();
  body["ID"] = std::to_string(lease);
  auto answer = co_await impl_->call("/v3/lease/revoke", body);
  if (!answer) co_return answer.error();
  co_return ok_status();
}

Task<Result<LeaseTimeToLive>> Client::time_to_live(std::int64_t lease) {
  Json body = Json::object();
  body["ID"] = std::to_string(lease);
  auto answer = co_await impl_->call("/v3/lease/timetolive", body);
  if (!answer) co_return answer.error();
  co_return parse_lease_time_to_live(answer.value());
}

Task<Status> Client::watch(std::string key, std::string range_end, std::int64_t start_revision,
                           std::function<void(const WatchMessage&)> on_message,
                           WatchEvents events) {
  auto impl = impl_;  // the stream may outlive a Client destroyed mid-watch
  co_return co_await impl->watch(key, range_end, start_revision, std::move(on_message), events);
}

void Client::cancel_watches() { impl_->cancel_watches(); }

}  // namespace ctrun::rendezvous::etcd
