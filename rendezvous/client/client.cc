#include "ctrun/rendezvous/client.h"
#include "ctrun/rendezvous/endpoint.h"

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include <algorithm>
#include <array>
#include <unordered_map>

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "rendezvous/client/client_protocol.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/tls/blocking_tls.h"
#include "rendezvous/tls/tls_context.h"
#include "rendezvous/tls/tls_stream.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;

namespace {

// What a TLS client asks of a server that does not speak TLS.
constexpr const char* kPlainServerHint = "is it a ctrund without --tls_cert?";

// The context for options.tls, made once per client: a file's error is kBadRequest, which
// connect() does not retry.
Result<std::shared_ptr<asio::ssl::context>> client_tls_context(const ClientOptions& options) {
  if (!options.tls) return std::shared_ptr<asio::ssl::context>();
  auto context = make_client_tls_context(*options.tls);
  if (!context) {
    return Error{context.error().code, "--rdzv_conf TLS: " + context.error().message};
  }
  return context;
}

// A read or write on a TLS connection that failed in TLS itself (an alert: under TLS 1.3 the
// server's refusal of this client's certificate arrives on the first read) is said as a
// handshake failure.
Error stream_error(SSL* ssl, const boost::system::error_code& ec, const std::string& what) {
  if (ssl != nullptr && ec.category() == asio::error::get_ssl_category()) {
    return Error{ErrorCode::kAuthFailed, handshake_failure(ssl, ec, kPlainServerHint)};
  }
  return Error{ErrorCode::kConnection, what + ": " + ec.message()};
}

}  // namespace

class AsyncClient::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, ClientOptions options)
      : io_(io),
        options_(std::move(options)),
        stream_(std::make_shared<TlsStream>(tcp::socket(io), nullptr)),
        decoder_(options_.max_frame_bytes),
        keep_alive_timer_(io) {}

  Task<Status> connect();
  Task<Result<Json>> call(Json request, std::optional<Duration> timeout);
  void close(const std::string& reason);
  void start_keep_alive(Duration interval, int max_missed);

  std::string local_address() const {
    boost::system::error_code ec;
    auto ep = stream_->socket().local_endpoint(ec);
    if (ec) return {};
    auto addr = ep.address();
    if (addr.is_v6() && addr.to_v6().is_v4_mapped()) {
      addr = asio::ip::make_address_v4(asio::ip::v4_mapped, addr.to_v6());
    }
    return addr.to_string();
  }

  bool connected_ = false;
  std::optional<std::uint16_t> worker_store_port_;  // the daemon's hello said where, if at all
  EventHandler on_event_;

 private:
  struct Pending {
    std::optional<Result<Json>> result;
    asio::steady_timer* signal;
  };

  Task<Status> connect_once(const std::string& endpoint_text);
  Task<Result<Json>> read_frame();
  Task<Status> handshake();
  Task<void> read_loop();
  void dispatch(Json frame);
  void flush();
  void fail_pending(const Error& error);
  std::string endpoint_text() const { return format_endpoint({options_.host, options_.port}); }

  asio::io_context& io_;
  ClientOptions options_;
  std::shared_ptr<asio::ssl::context> tls_context_;  // set: options_.tls, made at connect()
  // This connection; its handlers hold it, so a reconnect never frees a stream under them.
  std::shared_ptr<TlsStream> stream_;
  FrameDecoder decoder_;
  std::array<char, 64 * 1024> buffer_;
  std::string out_pending_;
  std::string out_in_flight_;
  bool writing_ = false;
  bool closed_ = false;
  // Counts connections: the handlers of a closed one (its reads and writes still completing)
  // must not touch the next one after a reconnect.
  std::uint64_t connection_ = 0;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Pending*> pending_;
  asio::steady_timer keep_alive_timer_;
};

Task<Status> AsyncClient::Impl::connect_once(const std::string& target) {
  tcp::resolver resolver(io_);
  auto [rec, endpoints] = co_await resolver.async_resolve(
      options_.host, std::to_string(options_.port), asio::as_tuple(asio::use_awaitable));
  if (rec)
    co_return Error{ErrorCode::kConnection, "cannot resolve " + target + ": " + rec.message()};
  boost::system::error_code ec;
  tcp::socket socket(io_);
  asio::steady_timer timer(io_, options_.handshake_timeout);
  auto outcome = co_await (
      asio::async_connect(socket, endpoints, asio::redirect_error(asio::use_awaitable, ec)) ||
      timer.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (outcome.index() == 1)
    co_return Error{ErrorCode::kConnection, "connect to " + target + " timed out"};
  if (ec) co_return Error{ErrorCode::kConnection, "connect to " + target + ": " + ec.message()};
  socket.set_option(tcp::no_delay(true), ec);
  stream_ = std::make_shared<TlsStream>(std::move(socket), tls_context_.get());
  co_return ok_status();
}

Task<Status> AsyncClient::Impl::connect() {
  if (connected_) co_return ok_status();
  const std::string target = endpoint_text();
  if (options_.tls && !tls_context_) {
    auto context = client_tls_context(options_);
    if (!context) co_return context.error();
    tls_context_ = std::move(context).value();
  }
  client_protocol::ConnectRetry retry(options_);
  while (true) {
    Status s = co_await connect_once(target);
    if (s) {
      decoder_ = FrameDecoder(options_.max_frame_bytes);
      asio::steady_timer timer(io_, options_.handshake_timeout);
      auto outcome =
          co_await (handshake() || timer.async_wait(asio::as_tuple(asio::use_awaitable)));
      if (outcome.index() == 1) {
        s = Error{ErrorCode::kTimeout, "no handshake from " + target + " within " +
                                           std::to_string(to_millis(options_.handshake_timeout)) +
                                           " ms"};
      } else {
        s = std::get<0>(std::move(outcome));
      }
    }
    if (s) break;
    // Told as it happens, so that a caller waiting on connect() can say what it waits for.
    if (on_event_)
      on_event_(Json{{"event", "connect_attempt_failed"}, {"reason", s.error().message}});
    stream_->close();
    auto pause = retry.next(s.error(), target);
    if (!pause) co_return pause.error();
    asio::steady_timer timer(io_, pause.value());
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  connected_ = true;
  closed_ = false;
  writing_ = false;
  out_pending_.clear();
  ++connection_;
  asio::co_spawn(
      io_, [self = shared_from_this()]() { return self->read_loop(); }, asio::detached);
  co_return ok_status();
}

Task<Result<Json>> AsyncClient::Impl::read_frame() {
  auto stream = stream_;
  while (true) {
    auto frame = decoder_.next();
    if (!frame) co_return frame.error();
    if (frame.value()) co_return std::move(*frame.value());
    auto [ec, n] = co_await stream->async_read_some(asio::buffer(buffer_),
                                                    asio::as_tuple(asio::use_awaitable));
    if (ec) co_return stream_error(stream->ssl(), ec, "connection to " + endpoint_text());
    decoder_.feed(buffer_.data(), n);
  }
}

Task<Status> AsyncClient::Impl::handshake() {
  auto stream = stream_;  // kept alive here should a timeout abandon this coroutine
  if (stream->tls()) {
    expect_server_name(stream->ssl(), options_.host);
    auto [ec] = co_await stream->async_handshake(asio::ssl::stream_base::client,
                                                 asio::as_tuple(asio::use_awaitable));
    if (ec) {
      co_return Error{
          handshake_may_pass_later(ec) ? ErrorCode::kConnection : ErrorCode::kAuthFailed,
          handshake_failure(stream->ssl(), ec, kPlainServerHint)};
    }
  }
  // Said first, so that a listener that also serves torch's TCPStore knows who we are.
  auto [pec, pwritten] =
      co_await stream->async_write(asio::buffer(kClientPreamble.data(), kClientPreamble.size()),
                                   asio::as_tuple(asio::use_awaitable));
  if (pec) co_return stream_error(stream->ssl(), pec, "sending preamble");
  auto challenge = co_await read_frame();
  if (!challenge) co_return challenge.error();
  auto hello = client_protocol::answer_challenge(challenge.value(), options_, endpoint_text());
  if (!hello) co_return hello.error();
  std::string bytes = encode_frame(hello.value().request);
  auto [wec, written] =
      co_await stream->async_write(asio::buffer(bytes), asio::as_tuple(asio::use_awaitable));
  if (wec) co_return stream_error(stream->ssl(), wec, "sending hello");
  auto answer = co_await read_frame();
  if (!answer) co_return answer.error();
  auto welcome = client_protocol::check_welcome(std::move(answer).value(), options_, hello.value(),
                                                endpoint_text());
  if (!welcome) co_return welcome.error();
  worker_store_port_.reset();
  if (welcome.value().worker_store) {
    worker_store_port_ = welcome.value().worker_store_port.value_or(options_.port);
  }
  co_return ok_status();
}

Task<void> AsyncClient::Impl::read_loop() {
  auto self = shared_from_this();
  auto stream = stream_;
  const std::uint64_t mine = connection_;
  // Frames that arrived together with the handshake answer are already buffered.
  while (true) {
    auto frame = decoder_.next();
    if (!frame) {
      close("bad frame from daemon: " + frame.error().message);
      co_return;
    }
    if (frame.value()) {
      // A handler that throws (say, on a mistyped field) must not end this loop silently:
      // calls would wait forever while keep-alives still flow. Drop the connection instead.
      try {
        dispatch(std::move(*frame.value()));
      } catch (const std::exception& e) {
        close(std::string("malformed frame from daemon: ") + e.what());
        co_return;
      }
      continue;
    }
    auto [ec, n] = co_await stream->async_read_some(asio::buffer(buffer_),
                                                    asio::as_tuple(asio::use_awaitable));
    if (mine != connection_) co_return;  // closed, and connected again since
    if (ec) {
      close(closed_ ? "closed"
                    : stream_error(stream->ssl(), ec, "connection to " + endpoint_text() + " lost")
                          .message);
      co_return;
    }
    decoder_.feed(buffer_.data(), n);
  }
}

void AsyncClient::Impl::dispatch(Json frame) {
  if (frame.contains("event")) {
    if (on_event_) on_event_(frame);
    return;
  }
  auto id = frame.find("id");
  if (id == frame.end() || !id->is_number_unsigned()) return;
  auto it = pending_.find(id->get<std::uint64_t>());
  if (it == pending_.end()) return;  // answered after this side gave up waiting
  it->second->result = response_payload(std::move(frame));
  it->second->signal->cancel();
  pending_.erase(it);
}

void AsyncClient::Impl::flush() {
  if (writing_ || out_pending_.empty() || !connected_) return;
  writing_ = true;
  out_in_flight_.swap(out_pending_);
  out_pending_.clear();
  stream_->async_write(
      asio::buffer(out_in_flight_),
      [self = shared_from_this(), stream = stream_, mine = connection_](
          boost::system::error_code ec, std::size_t) {
        if (mine != self->connection_) return;
        self->writing_ = false;
        if (ec) {
          self->close("write to " + self->endpoint_text() + " failed: " + ec.message());
          return;
        }
        self->flush();
      });
}

Task<Result<Json>> AsyncClient::Impl::call(Json request, std::optional<Duration> timeout) {
  auto self = shared_from_this();
  if (!connected_) co_return Error{ErrorCode::kConnection, "not connected to " + endpoint_text()};
  const std::uint64_t id = next_id_++;
  request["id"] = id;
  asio::steady_timer signal(io_);
  if (timeout) {
    signal.expires_after(*timeout);
  } else {
    signal.expires_at(asio::steady_timer::time_point::max());
  }
  Pending pending{std::nullopt, &signal};
  pending_[id] = &pending;
  append_frame(out_pending_, request);
  flush();
  co_await signal.async_wait(asio::as_tuple(asio::use_awaitable));
  pending_.erase(id);
  if (pending.result) co_return std::move(*pending.result);
  co_return Error{ErrorCode::kTimeout, "no answer to '" + request.value("op", "?") + "' within " +
                                           std::to_string(to_millis(timeout.value_or(Duration{}))) +
                                           " ms"};
}

void AsyncClient::Impl::fail_pending(const Error& error) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) {
    p->result = error;
    p->signal->cancel();
  }
}

void AsyncClient::Impl::close(const std::string& reason) {
  const bool was_connected = connected_;
  const bool by_us = closed_ || reason == "closed by client";
  connected_ = false;
  closed_ = true;
  stream_->close();
  keep_alive_timer_.cancel();
  fail_pending(Error{ErrorCode::kConnection, reason});
  if (was_connected && !by_us && on_event_) {
    on_event_(Json{{"event", "connection_lost"}, {"reason", reason}});
  }
}

void AsyncClient::Impl::start_keep_alive(Duration interval, int max_missed) {
  auto loop = [](std::shared_ptr<Impl> self, Duration interval, int max_missed) -> Task<void> {
    // Keep-alives in a row with no answer within four intervals.
    auto missed = std::make_shared<int>(0);
    const std::uint64_t mine = self->connection_;
    while (self->connected_) {
      self->keep_alive_timer_.expires_after(interval);
      auto [ec] = co_await self->keep_alive_timer_.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec || !self->connected_ || mine != self->connection_) co_return;
      if (*missed >= max_missed) {
        // A daemon that is stopped or cut off without a reset never closes the socket.
        self->close("the rendezvous at " + self->endpoint_text() + " answered none of the last " +
                    std::to_string(*missed) + " keep-alives");
        co_return;
      }
      // Not awaited in turn: a slow answer must not delay the next keep-alive.
      asio::co_spawn(self->io_, self->call(client_protocol::keep_alive(), interval * 4),
                     [missed](std::exception_ptr, Result<Json> answer) {
                       const bool unanswered =
                           !answer && answer.error().code == ErrorCode::kTimeout;
                       *missed = unanswered ? *missed + 1 : 0;
                     });
    }
  };
  asio::co_spawn(io_, loop(shared_from_this(), interval, max_missed), asio::detached);
}

// ---- AsyncClient -----------------------------------------------------------------------------

AsyncClient::AsyncClient(asio::io_context& io, ClientOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {}
AsyncClient::~AsyncClient() { impl_->close("closed by client"); }

Task<Status> AsyncClient::connect() { return impl_->connect(); }
bool AsyncClient::connected() const { return impl_->connected_; }
std::string AsyncClient::local_address() const { return impl_->local_address(); }
std::optional<std::uint16_t> AsyncClient::worker_store_port() const {
  return impl_->worker_store_port_;
}
void AsyncClient::close() { impl_->close("closed by client"); }
void AsyncClient::set_event_handler(EventHandler handler) { impl_->on_event_ = std::move(handler); }
void AsyncClient::start_keep_alive(Duration interval, int max_missed) {
  impl_->start_keep_alive(interval, max_missed);
}

Task<Result<Json>> AsyncClient::call(Json request, std::optional<Duration> timeout) {
  return impl_->call(std::move(request), timeout);
}

// The typed operations build their request outside any coroutine body (g++ 12 miscompiles
// braced initializer lists inside coroutines) and share one way of unwrapping the answer.
namespace {

template <typename Parse>
auto then(Task<Result<Json>> call, Parse parse)
    -> Task<decltype(parse(std::declval<const Json&>()))> {
  auto r = co_await std::move(call);
  if (!r) co_return r.error();
  co_return parse(r.value());
}

}  // namespace

namespace proto = client_protocol;

Task<Status> AsyncClient::set(const std::string& key, const std::string& value) {
  return then(call(proto::set(key, value)), proto::no_payload);
}
Task<Result<std::string>> AsyncClient::get(const std::string& key,
                                           std::optional<Duration> timeout) {
  return then(call(proto::get(key, timeout)), proto::value_bytes);
}
Task<Result<std::int64_t>> AsyncClient::add(const std::string& key, std::int64_t delta) {
  return then(call(proto::add(key, delta)), proto::value_int);
}
Task<Result<std::string>> AsyncClient::compare_set(const std::string& key,
                                                   const std::string& expected,
                                                   const std::string& desired) {
  return then(call(proto::compare_set(key, expected, desired)), proto::value_bytes);
}
Task<Result<bool>> AsyncClient::check(const std::vector<std::string>& keys) {
  return then(call(proto::check(keys)), proto::ready);
}
Task<Status> AsyncClient::wait(const std::vector<std::string>& keys,
                               std::optional<Duration> timeout) {
  return then(call(proto::wait(keys, timeout)), proto::no_payload);
}
Task<Result<bool>> AsyncClient::erase(const std::string& key) {
  return then(call(proto::erase(key)), proto::deleted);
}
Task<Result<std::int64_t>> AsyncClient::num_keys() {
  return then(call(proto::num_keys()), proto::count);
}
Task<Result<std::vector<std::string>>> AsyncClient::multi_get(const std::vector<std::string>& keys,
                                                              std::optional<Duration> timeout) {
  return then(call(proto::multi_get(keys, timeout)), proto::values);
}
Task<Status> AsyncClient::multi_set(const std::vector<std::string>& keys,
                                    const std::vector<std::string>& values) {
  return then(call(proto::multi_set(keys, values)), proto::no_payload);
}
Task<Status> AsyncClient::ping() { return then(call(proto::ping()), proto::no_payload); }

Task<Result<RoundAssignment>> AsyncClient::join(const NodeInfo& node,
                                                const RendezvousConfig& config) {
  Json request = to_json(JoinRequest{node, config});
  request["op"] = "join";
  return then(call(std::move(request)), round_assignment_from_json);
}

Task<Status> AsyncClient::leave() { return then(call(Json{{"op", "leave"}}), proto::no_payload); }

Task<Result<Json>> AsyncClient::resume(const std::string& node_id) {
  return call(Json{{"op", "resume"}, {"node", node_id}});
}

Task<Status> AsyncClient::report(bool succeeded, const std::string& message) {
  return then(
      call(Json{
          {"op", "report"}, {"result", succeeded ? "succeeded" : "failed"}, {"message", message}}),
      proto::no_payload);
}

Task<Status> AsyncClient::close_job() {
  return then(call(Json{{"op", "close"}}), proto::no_payload);
}

Task<Result<Json>> AsyncClient::status() { return call(proto::status()); }

// ---- Client ----------------------------------------------------------------------------------
// Blocking I/O in the caller's thread: one write and, usually, one read per call. The socket is
// non-blocking and poll() bounds every wait, so connect and call timeouts hold.

class Client::Impl {
 public:
  explicit Impl(ClientOptions options)
      : options_(std::move(options)), socket_(io_), decoder_(options_.max_frame_bytes) {}

  Status connect() {
    auto context = client_tls_context(options_);
    if (!context) return context.error();
    tls_context_ = std::move(context).value();
    client_protocol::ConnectRetry retry(options_);
    while (true) {
      Status s = connect_once();
      if (s) return s;
      auto pause = retry.next(s.error(), endpoint());
      if (!pause) return pause.error();
      std::this_thread::sleep_for(pause.value());
    }
  }

  Result<Json> call(Json request, std::optional<Duration> timeout) {
    std::lock_guard lock(mu_);
    if (auto s = take_posted_error(); !s) return s.error();
    if (!connected_) return Error{ErrorCode::kConnection, "not connected to " + endpoint()};
    const std::uint64_t id = next_id_++;
    request["id"] = id;
    // Beyond 2^40 ms (as the daemon reads timeouts) a deadline is the same as none.
    const bool bounded = timeout && to_millis(*timeout) < kMaxTimeoutMillis;
    const auto deadline = bounded ? Clock::now() + *timeout : Clock::time_point::max();
    if (auto s = write_all(encode_frame(request), deadline); !s) {
      disconnect();  // a frame may be half written: the stream is out of step
      return s.error();
    }
    while (true) {
      auto frame = read_frame(deadline);
      if (!frame) {
        if (frame.error().code == ErrorCode::kTimeout) {
          return Error{ErrorCode::kTimeout, "no answer to '" + request.value("op", "?") +
                                                "' within " + std::to_string(to_millis(*timeout)) +
                                                " ms"};
        }
        return frame.error();
      }
      // Events, posted requests' answers and late answers to calls that timed out are not
      // this call's answer.
      if (answer_id(frame.value()) != id) {
        absorb_posted(frame.value());
        continue;
      }
      return response_payload(std::move(frame).value());
    }
  }

  // Sends `request` and returns without its answer; a later call or flush() reads it.
  Status post(Json request) {
    std::lock_guard lock(mu_);
    if (auto s = take_posted_error(); !s) return s;
    if (!connected_) return Error{ErrorCode::kConnection, "not connected to " + endpoint()};
    // Bounded: a client that only posts must not fill the socket buffers both ways.
    if (posted_.size() >= kMaxPosted) {
      if (auto s = read_posted_answers(kMaxPosted / 2); !s) return s;
    }
    const std::uint64_t id = next_id_++;
    request["id"] = id;
    if (auto s = write_all(encode_frame(request), Clock::time_point::max()); !s) {
      disconnect();
      return s;
    }
    posted_.push_back(id);
    return ok_status();
  }

  Status flush() {
    std::lock_guard lock(mu_);
    if (auto s = read_posted_answers(0); !s) return s;
    return take_posted_error();
  }

  ~Impl() { disconnect(); }

 private:
  using Clock = std::chrono::steady_clock;

  std::string endpoint() const { return format_endpoint({options_.host, options_.port}); }

  void disconnect() {
    connected_ = false;
    tls_.reset();
    boost::system::error_code ignored;
    socket_.close(ignored);
    if (!posted_.empty() && !posted_error_) {
      posted_error_ = Error{ErrorCode::kConnection,
                            "connection to " + endpoint() + " lost before " +
                                std::to_string(posted_.size()) + " posted set(s) were answered"};
    }
    posted_.clear();
  }

  static std::uint64_t answer_id(const Json& frame) {
    auto id = frame.find("id");
    return id != frame.end() && id->is_number_unsigned() ? id->get<std::uint64_t>() : 0;
  }

  // Takes in the answer to a posted request, keeping the first error among them.
  void absorb_posted(const Json& frame) {
    auto it = std::find(posted_.begin(), posted_.end(), answer_id(frame));
    if (it == posted_.end()) return;
    posted_.erase(it);
    if (auto payload = response_payload(frame); !payload && !posted_error_) {
      posted_error_ = payload.error();
    }
  }

  // Reads until at most `keep` posted requests are unanswered.
  Status read_posted_answers(std::size_t keep) {
    while (posted_.size() > keep) {
      auto frame = read_frame(Clock::time_point::max());
      // A lost connection has become the posted sets' error (disconnect): say it once.
      if (!frame) return posted_error_ ? take_posted_error() : frame.error();
      absorb_posted(frame.value());
    }
    return ok_status();
  }

  // A posted request's error, reported once, before anything else is sent.
  Status take_posted_error() {
    if (!posted_error_) return ok_status();
    Error e = std::move(*posted_error_);
    posted_error_.reset();
    e.message = "an earlier post_set failed: " + e.message;
    return e;
  }

  Error fail(const std::string& what) {
    disconnect();
    return fail_quietly(what);
  }
  // fail() for a connection already dropped.
  Error fail_quietly(const std::string& what) const {
    return Error{ErrorCode::kConnection, "connection to " + endpoint() + ": " + what};
  }

  // Waits until the socket is ready for `events`, or the deadline passes; a failed poll drops
  // the connection.
  Status wait_ready(short events, Clock::time_point deadline) {
    auto s = wait_until_ready(socket_.native_handle(), events, deadline);
    if (!s && s.error().code == ErrorCode::kConnection) return fail(s.error().message);
    return s;
  }

  Status write_all(const std::string& bytes, Clock::time_point deadline) {
    if (tls_) {
      auto s = tls_->write_all(bytes.data(), bytes.size(), deadline);
      if (!s && s.error().code != ErrorCode::kTimeout) {
        const Error e = s.error();
        disconnect();
        return e.code == ErrorCode::kAuthFailed ? e : fail_quietly(e.message);
      }
      return s;
    }
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n =
          ::send(socket_.native_handle(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (auto s = wait_ready(POLLOUT, deadline); !s) return s;
      } else {
        return fail(std::strerror(errno));
      }
    }
    return ok_status();
  }

  Result<Json> read_frame(Clock::time_point deadline) {
    while (true) {
      auto frame = decoder_.next();
      if (!frame) {
        disconnect();
        return frame.error();
      }
      if (frame.value()) return std::move(*frame.value());
      if (tls_) {
        auto n = tls_->read_some(buffer_.data(), buffer_.size(), deadline);
        if (!n) {
          if (n.error().code == ErrorCode::kTimeout) return n.error();
          const Error e = n.error();
          disconnect();
          return e.code == ErrorCode::kAuthFailed ? e : fail_quietly(e.message);
        }
        if (n.value() == 0) return fail("closed by the daemon");
        decoder_.feed(buffer_.data(), n.value());
        continue;
      }
      // Read first and poll only when nothing is there: an answer usually is by now.
      const ssize_t n = ::recv(socket_.native_handle(), buffer_.data(), buffer_.size(), 0);
      if (n > 0) {
        decoder_.feed(buffer_.data(), static_cast<std::size_t>(n));
      } else if (n == 0) {
        return fail("closed by the daemon");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (auto s = wait_ready(POLLIN, deadline); !s) return s.error();
      } else {
        return fail(std::strerror(errno));
      }
    }
  }

  Status connect_once() {
    disconnect();
    decoder_ = FrameDecoder(options_.max_frame_bytes);
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (ec)
      return Error{ErrorCode::kConnection, "cannot resolve " + endpoint() + ": " + ec.message()};
    const auto deadline = Clock::now() + options_.handshake_timeout;
    std::string last_error = "no address";
    for (const auto& entry : endpoints) {
      const auto ep = entry.endpoint();
      socket_.close(ec);
      socket_.open(ep.protocol(), ec);
      if (ec) {
        last_error = ec.message();
        continue;
      }
      socket_.non_blocking(true, ec);
      if (::connect(socket_.native_handle(), ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
        if (errno != EINPROGRESS) {
          last_error = std::strerror(errno);
          continue;
        }
        if (auto s = wait_ready(POLLOUT, deadline); !s) {
          last_error = "connect timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(socket_.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last_error = std::strerror(err);
          continue;
        }
      }
      socket_.set_option(tcp::no_delay(true), ec);
      if (tls_context_) {
        auto tls = BlockingTls::connect(*tls_context_, socket_.native_handle(), options_.host,
                                        deadline, kPlainServerHint);
        if (!tls) {
          disconnect();
          return tls.error();
        }
        tls_ = std::move(tls).value();
      }
      connected_ = true;
      return handshake(deadline);
    }
    return Error{ErrorCode::kConnection, "connect to " + endpoint() + ": " + last_error};
  }

  Status handshake(Clock::time_point deadline) {
    if (auto s = write_all(std::string(kClientPreamble), deadline); !s) {
      return handshake_error(s.error());
    }
    auto challenge = read_frame(deadline);
    if (!challenge) return handshake_error(challenge.error());
    auto hello = client_protocol::answer_challenge(challenge.value(), options_, endpoint());
    if (!hello) return handshake_error(hello.error());
    if (auto s = write_all(encode_frame(hello.value().request), deadline); !s) {
      return handshake_error(s.error());
    }
    auto answer = read_frame(deadline);
    if (!answer) return handshake_error(answer.error());
    auto welcome = client_protocol::check_welcome(std::move(answer).value(), options_,
                                                  hello.value(), endpoint());
    if (!welcome) return handshake_error(welcome.error());
    return ok_status();
  }

  Status handshake_error(Error e) {
    disconnect();
    if (e.code == ErrorCode::kTimeout) e.message = "no handshake from " + endpoint() + " in time";
    return e;
  }

  std::mutex mu_;
  ClientOptions options_;
  asio::io_context io_;  // only to own the socket and resolve names
  tcp::socket socket_;
  std::shared_ptr<asio::ssl::context> tls_context_;  // set: options_.tls
  std::unique_ptr<BlockingTls> tls_;                 // this connection's TLS, over socket_
  FrameDecoder decoder_;
  std::array<char, 64 * 1024> buffer_;
  std::uint64_t next_id_ = 1;
  bool connected_ = false;
  static constexpr std::size_t kMaxPosted = 256;
  std::vector<std::uint64_t> posted_;  // ids of posted requests not answered yet, in order
  std::optional<Error> posted_error_;
};

namespace {

template <typename Parse>
auto finish(Result<Json> answer, Parse parse) -> decltype(parse(std::declval<const Json&>())) {
  if (!answer) return answer.error();
  return parse(answer.value());
}

}  // namespace

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  std::unique_ptr<Client> client(new Client(std::move(options)));
  if (auto s = client->impl_->connect(); !s) return s.error();
  return client;
}

Result<Json> Client::call(Json request, std::optional<Duration> timeout) {
  return impl_->call(std::move(request), timeout);
}
Status Client::set(const std::string& key, const std::string& value) {
  return finish(call(proto::set(key, value)), proto::no_payload);
}
Status Client::post_set(const std::string& key, const std::string& value) {
  return impl_->post(proto::set(key, value));
}
Status Client::flush() { return impl_->flush(); }
Result<std::string> Client::get(const std::string& key, std::optional<Duration> timeout) {
  return finish(call(proto::get(key, timeout)), proto::value_bytes);
}
Result<std::int64_t> Client::add(const std::string& key, std::int64_t delta) {
  return finish(call(proto::add(key, delta)), proto::value_int);
}
Result<std::string> Client::compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  return finish(call(proto::compare_set(key, expected, desired)), proto::value_bytes);
}
Result<bool> Client::check(const std::vector<std::string>& keys) {
  return finish(call(proto::check(keys)), proto::ready);
}
Status Client::wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  return finish(call(proto::wait(keys, timeout)), proto::no_payload);
}
Result<bool> Client::erase(const std::string& key) {
  return finish(call(proto::erase(key)), proto::deleted);
}
Result<std::int64_t> Client::num_keys() { return finish(call(proto::num_keys()), proto::count); }
Result<std::vector<std::string>> Client::multi_get(const std::vector<std::string>& keys,
                                                   std::optional<Duration> timeout) {
  return finish(call(proto::multi_get(keys, timeout)), proto::values);
}
Status Client::multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  return finish(call(proto::multi_set(keys, values)), proto::no_payload);
}
Status Client::ping() { return finish(call(proto::ping()), proto::no_payload); }
Result<Json> Client::status() { return call(proto::status()); }
Result<QuorumAssignment> Client::quorum(const QuorumRequest& request,
                                        std::optional<Duration> timeout) {
  return finish(call(proto::quorum(request), timeout), quorum_assignment_from_json);
}
Status Client::quorum_heartbeat(const std::string& replica, Duration timeout) {
  return finish(call(proto::quorum_heartbeat(replica), timeout), proto::no_payload);
}

}  // namespace ctrun::rendezvous
