#include "rendezvous/etcd/etcd_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <set>

namespace ctrun::rendezvous::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {

constexpr std::size_t kMaxIdleConnections = 4;
constexpr std::uint32_t kMaxAnswerBytes = 64u << 20;

struct Connection {
  explicit Connection(asio::io_context& io, std::size_t endpoint_index)
      : stream(io), endpoint(endpoint_index) {}
  beast::tcp_stream stream;
  std::size_t endpoint;
  beast::flat_buffer buffer;
};

std::string where(const Endpoint& ep) { return format_endpoint(ep); }

Error connection_error(const Endpoint& ep, const std::string& what) {
  return Error{ErrorCode::kConnection, "etcd at " + where(ep) + ": " + what};
}

http::request<http::string_body> post(const Endpoint& ep, const std::string& path,
                                      std::string body) {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, where(ep));
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

}  // namespace

class Client::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, ClientOptions options) : io_(io), options_(std::move(options)) {}

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
    auto c = std::make_unique<Connection>(io_, index);
    c->stream.expires_at(until);
    auto [connect_error, at] =
        co_await c->stream.async_connect(found, asio::as_tuple(asio::use_awaitable));
    (void)at;
    if (connect_error) {
      co_return connection_error(ep, connect_error == beast::error::timeout
                                         ? std::string("connect timed out")
                                         : connect_error.message());
    }
    c->stream.socket().set_option(tcp::no_delay(true));
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
        if (!opened) co_return Attempt{true, opened.error()};
        c = std::move(opened).value();
      }
      auto req = post(ep, path, body);
      c->stream.expires_at(until);
      auto [write_error, written] =
          co_await http::async_write(c->stream, req, asio::as_tuple(asio::use_awaitable));
      (void)written;
      http::response_parser<http::string_body> parser;
      parser.body_limit(kMaxAnswerBytes);
      boost::system::error_code read_error = write_error;
      if (!write_error) {
        auto [e, n] = co_await http::async_read(c->stream, c->buffer, parser,
                                                asio::as_tuple(asio::use_awaitable));
        (void)n;
        read_error = e;
      }
      if (read_error) {
        if (reused && read_error != beast::error::timeout && pass == 0) continue;
        co_return Attempt{true, connection_error(ep, read_error == beast::error::timeout
                                                         ? std::string("no answer in time")
                                                         : read_error.message())};
      }
      auto res = parser.release();
      if (res.keep_alive()) give_back(std::move(c));
      const int status = res.result_int();
      if (status == 503) co_return Attempt{true, error_from_answer(status, res.body())};
      if (status != 200) co_return Attempt{false, error_from_answer(status, res.body())};
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
                     std::function<void(const WatchMessage&)> on_message) {
    auto self = shared_from_this();
    const std::string body = watch_request(key, range_end, start_revision).dump();
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
      auto req = post(ep, "/v3/watch", body);
      c->stream.expires_at(std::chrono::steady_clock::now() + options_.attempt_timeout);
      auto [write_error, written] =
          co_await http::async_write(c->stream, req, asio::as_tuple(asio::use_awaitable));
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
      auto [header_error, h] = co_await http::async_read_header(
          c->stream, c->buffer, parser, asio::as_tuple(asio::use_awaitable));
      (void)h;
      boost::system::error_code read_error = header_error;
      if (!header_error) {
        c->stream.expires_never();
        auto [e, n] = co_await http::async_read(c->stream, c->buffer, parser,
                                                asio::as_tuple(asio::use_awaitable));
        (void)n;
        read_error = e;
      }
      const bool cancelled = watches_.erase(c) == 0;
      if (cancelled) co_return ok_status();
      if (stream_error) co_return *stream_error;
      if (parser.is_header_done() && parser.get().result_int() != 200) {
        co_return error_from_answer(parser.get().result_int(), parser.get().body());
      }
      co_return connection_error(
          ep, "watch stream ended" + (read_error ? ": " + read_error.message() : std::string()));
    }
    co_return last;
  }

  void cancel_watches() {
    auto all = std::move(watches_);
    watches_.clear();
    for (const auto& c : all) c->stream.close();
  }

  void close_all() {
    closed_ = true;
    cancel_watches();
    idle_.clear();
  }

 private:
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
  std::vector<std::unique_ptr<Connection>> idle_;
  std::set<std::shared_ptr<Connection>> watches_;
  std::size_t preferred_ = 0;  // the endpoint that answered last
  bool closed_ = false;        // the Client is gone: calls still in flight end at their next step
};

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
                           std::function<void(const WatchMessage&)> on_message) {
  auto impl = impl_;  // the stream may outlive a Client destroyed mid-watch
  co_return co_await impl->watch(key, range_end, start_revision, std::move(on_message));
}

void Client::cancel_watches() { impl_->cancel_watches(); }

}  // namespace ctrun::rendezvous::etcd
