#include "ctrun/rendezvous/client.h"

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include <array>
#include <unordered_map>

#include "ctrun/rendezvous/auth.h"
#include "ctrun/rendezvous/message.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace asio::experimental::awaitable_operators;

namespace {

std::int64_t millis(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

Json with_timeout(Json request, std::optional<Duration> timeout) {
  // The daemon takes 0..2^40 ms; a longer wait is the same as no deadline.
  if (timeout && millis(*timeout) < (std::int64_t{1} << 40)) {
    request["timeout_ms"] = std::max<std::int64_t>(0, millis(*timeout));
  }
  return request;
}

Json hello_request(const ClientOptions& options, const std::string& server_nonce,
                   const std::string& client_nonce) {
  Json hello{{"op", "hello"}, {"id", 0}, {"version", kProtocolVersion}, {"job", options.job}};
  if (options.token) {
    hello["proof"] = to_binary(client_proof(*options.token, server_nonce, options.job));
    hello["nonce"] = to_binary(client_nonce);
  }
  return hello;
}

Json keep_alive_request() { return Json{{"op", "keep_alive"}}; }

}  // namespace

class AsyncClient::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, ClientOptions options)
      : io_(io),
        options_(std::move(options)),
        socket_(io),
        decoder_(options_.max_frame_bytes),
        keep_alive_timer_(io) {}

  Task<Status> connect();
  Task<Result<Json>> call(Json request, std::optional<Duration> timeout);
  void close(const std::string& reason);
  void start_keep_alive(Duration interval);

  std::string local_address() const {
    boost::system::error_code ec;
    auto ep = socket_.local_endpoint(ec);
    if (ec) return {};
    auto addr = ep.address();
    if (addr.is_v6() && addr.to_v6().is_v4_mapped()) {
      addr = asio::ip::make_address_v4(asio::ip::v4_mapped, addr.to_v6());
    }
    return addr.to_string();
  }

  bool connected_ = false;
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
  std::string endpoint_text() const {
    return options_.host + ":" + std::to_string(options_.port);
  }

  asio::io_context& io_;
  ClientOptions options_;
  tcp::socket socket_;
  FrameDecoder decoder_;
  std::array<char, 64 * 1024> buffer_;
  std::string out_pending_;
  std::string out_in_flight_;
  bool writing_ = false;
  bool closed_ = false;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, Pending*> pending_;
  asio::steady_timer keep_alive_timer_;
};

Task<Status> AsyncClient::Impl::connect_once(const std::string& target) {
  tcp::resolver resolver(io_);
  auto [rec, endpoints] = co_await resolver.async_resolve(
      options_.host, std::to_string(options_.port), asio::as_tuple(asio::use_awaitable));
  if (rec) co_return Error{ErrorCode::kConnection, "cannot resolve " + target + ": " + rec.message()};
  boost::system::error_code ec;
  socket_ = tcp::socket(io_);
  asio::steady_timer timer(io_, options_.handshake_timeout);
  auto outcome = co_await (asio::async_connect(socket_, endpoints,
                                               asio::redirect_error(asio::use_awaitable, ec)) ||
                           timer.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (outcome.index() == 1) co_return Error{ErrorCode::kConnection, "connect to " + target + " timed out"};
  if (ec) co_return Error{ErrorCode::kConnection, "connect to " + target + ": " + ec.message()};
  socket_.set_option(tcp::no_delay(true), ec);
  co_return ok_status();
}

Task<Status> AsyncClient::Impl::connect() {
  if (connected_) co_return ok_status();
  const std::string target = endpoint_text();
  const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
  Duration backoff = options_.initial_backoff;
  while (true) {
    Status s = co_await connect_once(target);
    if (s) {
      decoder_ = FrameDecoder(options_.max_frame_bytes);
      asio::steady_timer timer(io_, options_.handshake_timeout);
      auto outcome = co_await (handshake() || timer.async_wait(asio::as_tuple(asio::use_awaitable)));
      if (outcome.index() == 1) {
        s = Error{ErrorCode::kTimeout, "no handshake from " + target + " within " +
                                           std::to_string(millis(options_.handshake_timeout)) + " ms"};
      } else {
        s = std::get<0>(std::move(outcome));
      }
      // A refusal (version, token) will not change on retry: report it at once. A full daemon
      // (kLimit) or a dropped connection may clear up.
      const bool retryable =
          s || s.error().code == ErrorCode::kConnection || s.error().code == ErrorCode::kLimit;
      if (!retryable) {
        boost::system::error_code ignored;
        socket_.close(ignored);
        co_return s;
      }
    }
    if (s) break;
    if (std::chrono::steady_clock::now() + backoff > deadline) {
      co_return Error{ErrorCode::kConnection,
                      "could not reach ctrund at " + target + " within " +
                          std::to_string(millis(options_.connect_timeout)) + " ms: " +
                          s.error().message};
    }
    asio::steady_timer pause(io_, backoff);
    co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  connected_ = true;
  closed_ = false;
  asio::co_spawn(io_, [self = shared_from_this()]() { return self->read_loop(); }, asio::detached);
  co_return ok_status();
}

Task<Result<Json>> AsyncClient::Impl::read_frame() {
  while (true) {
    auto frame = decoder_.next();
    if (!frame) co_return frame.error();
    if (frame.value()) co_return std::move(*frame.value());
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buffer_),
                                                    asio::as_tuple(asio::use_awaitable));
    if (ec) co_return Error{ErrorCode::kConnection, "connection to " + endpoint_text() + ": " + ec.message()};
    decoder_.feed(buffer_.data(), n);
  }
}

Task<Status> AsyncClient::Impl::handshake() {
  auto challenge = co_await read_frame();
  if (!challenge) co_return challenge.error();
  if (auto err = response_payload(challenge.value()); !err) co_return err.error();  // e.g. busy
  if (challenge.value().value("event", "") != "challenge") {
    co_return Error{ErrorCode::kBadFrame, endpoint_text() + " is not a ctrund (no challenge)"};
  }
  auto server_nonce = get_bytes(challenge.value(), "nonce");
  if (!server_nonce) co_return server_nonce.error();
  const bool auth_required = challenge.value().value("auth", false);
  if (auth_required && !options_.token) {
    co_return Error{ErrorCode::kAuthFailed,
                    "ctrund at " + endpoint_text() + " requires a token and none was given"};
  }
  if (!auth_required && options_.token) {
    // A daemon without the token cannot prove itself: it may not be ours.
    co_return Error{ErrorCode::kAuthFailed, "ctrund at " + endpoint_text() +
                                                " holds no token but this client has one"};
  }
  const std::string client_nonce = options_.token ? random_bytes(kNonceBytes) : std::string();
  std::string bytes = encode_frame(hello_request(options_, server_nonce.value(), client_nonce));
  auto [wec, written] = co_await asio::async_write(socket_, asio::buffer(bytes),
                                                   asio::as_tuple(asio::use_awaitable));
  if (wec) co_return Error{ErrorCode::kConnection, "sending hello: " + wec.message()};
  auto answer = co_await read_frame();
  if (!answer) co_return answer.error();
  auto payload = response_payload(std::move(answer).value());
  if (!payload) co_return payload.error();
  if (options_.token) {
    auto proof = get_bytes(payload.value(), "proof");
    if (!proof || !constant_time_equal(proof.value(), server_proof(*options_.token, client_nonce,
                                                                   server_nonce.value()))) {
      co_return Error{ErrorCode::kAuthFailed,
                      "ctrund at " + endpoint_text() + " could not prove it holds the token"};
    }
  }
  co_return ok_status();
}

Task<void> AsyncClient::Impl::read_loop() {
  auto self = shared_from_this();
  // Frames that arrived together with the handshake answer are already buffered.
  while (true) {
    auto frame = decoder_.next();
    if (!frame) {
      close("bad frame from daemon: " + frame.error().message);
      co_return;
    }
    if (frame.value()) {
      dispatch(std::move(*frame.value()));
      continue;
    }
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buffer_),
                                                    asio::as_tuple(asio::use_awaitable));
    if (ec) {
      close(closed_ ? "closed" : "connection to " + endpoint_text() + " lost: " + ec.message());
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
  asio::async_write(socket_, asio::buffer(out_in_flight_),
                    [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
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
                                           std::to_string(millis(timeout.value_or(Duration{}))) +
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
  boost::system::error_code ignored;
  socket_.close(ignored);
  keep_alive_timer_.cancel();
  fail_pending(Error{ErrorCode::kConnection, reason});
  if (was_connected && !by_us && on_event_) {
    on_event_(Json{{"event", "connection_lost"}, {"reason", reason}});
  }
}

void AsyncClient::Impl::start_keep_alive(Duration interval) {
  auto loop = [](std::shared_ptr<Impl> self, Duration interval) -> Task<void> {
    while (self->connected_) {
      self->keep_alive_timer_.expires_after(interval);
      auto [ec] = co_await self->keep_alive_timer_.async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec || !self->connected_) co_return;
      // Not awaited in turn: a slow answer must not delay the next keep-alive.
      asio::co_spawn(self->io_, self->call(keep_alive_request(), interval * 4), asio::detached);
    }
  };
  asio::co_spawn(io_, loop(shared_from_this(), interval), asio::detached);
}

// ---- AsyncClient -----------------------------------------------------------------------------

AsyncClient::AsyncClient(asio::io_context& io, ClientOptions options)
    : impl_(std::make_shared<Impl>(io, std::move(options))) {}
AsyncClient::~AsyncClient() { impl_->close("closed by client"); }

Task<Status> AsyncClient::connect() { return impl_->connect(); }
bool AsyncClient::connected() const { return impl_->connected_; }
std::string AsyncClient::local_address() const { return impl_->local_address(); }
void AsyncClient::close() { impl_->close("closed by client"); }
void AsyncClient::set_event_handler(EventHandler handler) { impl_->on_event_ = std::move(handler); }
void AsyncClient::start_keep_alive(Duration interval) { impl_->start_keep_alive(interval); }

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

Status no_payload(const Json&) { return ok_status(); }

Json binary_list(const std::vector<std::string>& values) {
  Json list = Json::array();
  for (const auto& v : values) list.push_back(to_binary(v));
  return list;
}

}  // namespace

Task<Status> AsyncClient::set(const std::string& key, const std::string& value) {
  return then(call(Json{{"op", "set"}, {"key", key}, {"value", to_binary(value)}}), no_payload);
}

Task<Result<std::string>> AsyncClient::get(const std::string& key, std::optional<Duration> timeout) {
  return then(call(with_timeout(Json{{"op", "get"}, {"key", key}}, timeout)),
              [](const Json& j) { return get_bytes(j, "value"); });
}

Task<Result<std::int64_t>> AsyncClient::add(const std::string& key, std::int64_t delta) {
  return then(call(Json{{"op", "add"}, {"key", key}, {"delta", delta}}),
              [](const Json& j) { return get_int(j, "value"); });
}

Task<Result<std::string>> AsyncClient::compare_set(const std::string& key,
                                                   const std::string& expected,
                                                   const std::string& desired) {
  return then(call(Json{{"op", "compare_set"},
                        {"key", key},
                        {"expected", to_binary(expected)},
                        {"desired", to_binary(desired)}}),
              [](const Json& j) { return get_bytes(j, "value"); });
}

Task<Result<bool>> AsyncClient::check(const std::vector<std::string>& keys) {
  return then(call(Json{{"op", "check"}, {"keys", keys}}),
              [](const Json& j) { return Result<bool>(j.value("ready", false)); });
}

Task<Status> AsyncClient::wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  return then(call(with_timeout(Json{{"op", "wait"}, {"keys", keys}}, timeout)), no_payload);
}

Task<Result<bool>> AsyncClient::erase(const std::string& key) {
  return then(call(Json{{"op", "delete"}, {"key", key}}),
              [](const Json& j) { return Result<bool>(j.value("deleted", false)); });
}

Task<Result<std::int64_t>> AsyncClient::num_keys() {
  return then(call(Json{{"op", "num_keys"}}), [](const Json& j) { return get_int(j, "count"); });
}

Task<Result<std::vector<std::string>>> AsyncClient::multi_get(const std::vector<std::string>& keys,
                                                              std::optional<Duration> timeout) {
  return then(call(with_timeout(Json{{"op", "multi_get"}, {"keys", keys}}, timeout)),
              [](const Json& j) { return get_bytes_list(j, "values"); });
}

Task<Status> AsyncClient::multi_set(const std::vector<std::string>& keys,
                                    const std::vector<std::string>& values) {
  return then(call(Json{{"op", "multi_set"}, {"keys", keys}, {"values", binary_list(values)}}),
              no_payload);
}

Task<Status> AsyncClient::ping() { return then(call(Json{{"op", "ping"}}), no_payload); }

Task<Result<RoundAssignment>> AsyncClient::join(const NodeInfo& node, const RendezvousConfig& config) {
  Json request{{"op", "join"},
               {"node", node.node_id},
               {"host", node.host},
               {"local_world_size", node.local_world_size},
               {"master_port", node.master_port},
               {"requested_rank", node.requested_rank},
               {"min_nodes", config.min_nodes},
               {"max_nodes", config.max_nodes},
               {"join_timeout_ms", millis(config.join_timeout)},
               {"last_call_timeout_ms", millis(config.last_call_timeout)},
               {"close_timeout_ms", millis(config.close_timeout)},
               {"keep_alive_interval_ms", millis(config.keep_alive_interval)},
               {"keep_alive_max_attempt", config.keep_alive_max_attempt}};
  return then(call(std::move(request)), round_assignment_from_json);
}

Task<Status> AsyncClient::leave() { return then(call(Json{{"op", "leave"}}), no_payload); }

Task<Status> AsyncClient::report(bool succeeded, const std::string& message) {
  return then(call(Json{{"op", "report"},
                        {"result", succeeded ? "succeeded" : "failed"},
                        {"message", message}}),
              no_payload);
}

Task<Status> AsyncClient::close_job() { return then(call(Json{{"op", "close"}}), no_payload); }

Task<Result<Json>> AsyncClient::status() { return call(Json{{"op", "status"}}); }

// ---- Client ----------------------------------------------------------------------------------

Client::Client(ClientOptions options) : async_(io_, std::move(options)) {}
Client::~Client() {
  async_.close();
  io_.restart();
  io_.poll();  // let the closed socket's handlers finish before the io_context goes
}

template <typename T>
T Client::run(Task<T> task) {
  std::lock_guard lock(mu_);
  std::optional<T> out;
  asio::co_spawn(io_, std::move(task), [&out](std::exception_ptr e, T value) {
    if (!e) {
      out.emplace(std::move(value));
      return;
    }
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      out.emplace(Error{ErrorCode::kInternal, ex.what()});
    }
  });
  while (!out) {
    if (io_.stopped()) io_.restart();
    io_.run_one();
  }
  return std::move(*out);
}

Result<std::unique_ptr<Client>> Client::connect(ClientOptions options) {
  std::unique_ptr<Client> client(new Client(std::move(options)));
  if (auto s = client->run(client->async_.connect()); !s) return s.error();
  return client;
}

Result<Json> Client::call(Json request, std::optional<Duration> timeout) {
  return run(async_.call(std::move(request), timeout));
}
Status Client::set(const std::string& key, const std::string& value) { return run(async_.set(key, value)); }
Result<std::string> Client::get(const std::string& key, std::optional<Duration> timeout) {
  return run(async_.get(key, timeout));
}
Result<std::int64_t> Client::add(const std::string& key, std::int64_t delta) {
  return run(async_.add(key, delta));
}
Result<std::string> Client::compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  return run(async_.compare_set(key, expected, desired));
}
Result<bool> Client::check(const std::vector<std::string>& keys) { return run(async_.check(keys)); }
Status Client::wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  return run(async_.wait(keys, timeout));
}
Result<bool> Client::erase(const std::string& key) { return run(async_.erase(key)); }
Result<std::int64_t> Client::num_keys() { return run(async_.num_keys()); }
Result<std::vector<std::string>> Client::multi_get(const std::vector<std::string>& keys,
                                                   std::optional<Duration> timeout) {
  return run(async_.multi_get(keys, timeout));
}
Status Client::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  return run(async_.multi_set(keys, values));
}
Status Client::ping() { return run(async_.ping()); }
Result<Json> Client::status() { return run(async_.status()); }

}  // namespace ctrun::rendezvous
