#include "rendezvous/daemon/server.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include <sys/socket.h>

#include <array>
#include <unordered_map>

#include "rendezvous/base/open_files.h"
#include "rendezvous/daemon/file_state_log.h"
#include "rendezvous/daemon/listen.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/tls/tls_context.h"
#include "rendezvous/tls/tls_stream.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

// One TCP connection, plain or TLS. Reads go straight into the Service; writes queue in
// `pending_` and go out in one async_write per batch: the answers to every request one read
// brought (a client that pipelines, e.g. Client::post_set then get) leave together, in one send,
// after that read is handled. On a TLS port nothing is read or written before the handshake,
// and a connection the service closes before then is dropped without one: a flood of
// handshakes costs no more than the connection limits let in. Owned by Server::Impl's map;
// handlers hold a shared_ptr.
class Session : public std::enable_shared_from_this<Session> {
 public:
  struct Hooks {
    std::function<void(ConnectionId)> on_gone;
    std::function<void(const std::string& peer, const std::string& why)> on_tls_failure;
  };

  // A buffer the size of a read, shared by the plain sessions of one server: the loop is
  // single-threaded and the service consumes each read before the next, so a plain session
  // needs no buffer of its own while it waits (a store with 65,536 idle connections would hold
  // 4 GiB of them). A TLS stream reads into one of its own.
  using ReadBuffer = std::array<char, 64 * 1024>;

  Session(TlsStream stream, ConnectionId id, Service& service, std::size_t max_pending, Hooks hooks,
          std::weak_ptr<int> server_alive, ReadBuffer& shared)
      : stream_(std::move(stream)),
        id_(id),
        server_alive_(std::move(server_alive)),
        service_(service),
        max_pending_(max_pending),
        hooks_(std::move(hooks)),
        buffer_(stream_.tls() ? *(own_buffer_ = std::make_unique<ReadBuffer>()) : shared),
        ready_(!stream_.tls()) {
    if (!stream_.tls()) {
      boost::system::error_code ignored;
      stream_.socket().non_blocking(true, ignored);
    }
  }

  void start() {
    if (ready_) return read();
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        [self = shared_from_this()](boost::system::error_code ec) { self->on_first_bytes(ec); });
  }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }

  // False when the peer was cut because it does not read what it asked for: the backlog would
  // otherwise grow without bound.
  bool send(std::string bytes) {
    if (closed_ || cut_) return true;
    if (in_flight_.size() + pending_.size() + bytes.size() > max_pending_) {
      cut_ = true;
      abort();
      return false;
    }
    if (pending_.empty()) {
      pending_ = std::move(bytes);
    } else {
      pending_ += bytes;
    }
    if (ready_ && !writing_ && !handling_read_) write();
    return true;
  }

  // Closes after what is queued has been written (the service asked for it); before a TLS
  // handshake, at once.
  void close_after_flush() {
    closing_ = true;
    if (!ready_) return abort();
    if (!writing_ && !handling_read_) shutdown();
  }

  // Closes now; the service hears of it as a disconnect.
  void abort() {
    if (closed_) return;
    stream_.close();
  }

 private:
  // A TLS client opens with a handshake record (content type 22); ctrun's plain client opens
  // with its preamble and is told, in its own framing, that this port wants TLS.
  void on_first_bytes(boost::system::error_code ec) {
    if (closed_ || server_alive_.expired()) return;
    char first = 0;
    if (ec || ::recv(stream_.socket().native_handle(), &first, 1, MSG_PEEK) != 1) return lost();
    if (first != 22) return refuse_plain();
    stream_.async_handshake(
        asio::ssl::stream_base::server,
        [self = shared_from_this()](boost::system::error_code ec) { self->on_handshake(ec); });
  }

  void on_handshake(boost::system::error_code ec) {
    if (closed_ || server_alive_.expired()) return;
    if (ec) {
      if (ec != asio::error::operation_aborted) {
        hooks_.on_tls_failure(peer_, server_handshake_failure(stream_.ssl(), ec));
      }
      return lost();
    }
    ready_ = true;
    if (closing_) return shutdown();
    if (!pending_.empty()) write();
    read();
  }

  void refuse_plain() {
    in_flight_ = encode_frame(error_response(
        0, Error{ErrorCode::kAuthFailed,
                 "this rendezvous speaks TLS only (ctrund --tls_cert): give --rdzv_conf "
                 "cacert=FILE (with cert and key where it asks for a client certificate)"}));
    hooks_.on_tls_failure(peer_, "a plain client on the TLS port (told to use TLS)");
    writing_ = true;
    asio::async_write(stream_.socket(), asio::buffer(in_flight_),
                      [self = shared_from_this()](boost::system::error_code, std::size_t) {
                        self->writing_ = false;
                        if (self->closed_ || self->server_alive_.expired()) return;
                        self->shutdown();
                        self->service_.on_disconnect(self->id_);
                      });
  }

  void lost() {
    stream_.close();
    gone();
    service_.on_disconnect(id_);
  }

  void read() {
    if (own_buffer_) {
      stream_.async_read_some(asio::buffer(buffer_),
                              [self = shared_from_this()](boost::system::error_code ec,
                                                          std::size_t n) { self->on_read(ec, n); });
      return;
    }
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        [self = shared_from_this()](boost::system::error_code ec) { self->on_readable(ec); });
  }

  // A plain socket has bytes (or was closed): read them into the shared buffer now.
  void on_readable(boost::system::error_code ec) {
    if (closed_ || server_alive_.expired()) return;
    std::size_t n = 0;
    if (!ec) n = stream_.socket().read_some(asio::buffer(buffer_), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return read();
    on_read(ec, n);
  }

  void on_read(boost::system::error_code ec, std::size_t n) {
    if (closed_ || server_alive_.expired()) return;
    if (ec) {
      gone();
      service_.on_disconnect(id_);
      return;
    }
    if (!closing_) {
      handling_read_ = true;
      service_.on_data(id_, buffer_.data(), n);
      handling_read_ = false;
      if (!closed_ && !writing_) {
        if (!pending_.empty()) {
          write();
        } else if (closing_) {
          shutdown();
        }
      }
    }
    if (!closed_) read();
  }

  void write() {
    writing_ = true;
    in_flight_ = std::move(pending_);
    pending_.clear();
    stream_.async_write(asio::buffer(in_flight_),
                        [self = shared_from_this()](boost::system::error_code ec, std::size_t) {
                          self->on_written(ec);
                        });
  }

  void on_written(boost::system::error_code ec) {
    writing_ = false;
    if (closed_ || server_alive_.expired()) return;
    if (ec) return abort();  // the read side reports the disconnect
    if (!pending_.empty()) return write();
    if (closing_) shutdown();
  }

  void shutdown() {
    stream_.close();
    gone();
  }

  void gone() {
    if (closed_) return;
    closed_ = true;
    hooks_.on_gone(id_);
  }

  TlsStream stream_;
  ConnectionId id_;
  // Handlers may run after the server is gone (stop() then destruction while the loop still
  // runs): they touch nothing of it then.
  std::weak_ptr<int> server_alive_;
  Service& service_;
  std::size_t max_pending_;
  Hooks hooks_;
  std::string peer_;
  std::unique_ptr<ReadBuffer> own_buffer_;  // TLS only
  ReadBuffer& buffer_;
  std::string pending_;
  std::string in_flight_;
  bool ready_;  // plain, or TLS after its handshake: bytes may flow
  bool writing_ = false;
  bool handling_read_ = false;  // answers wait for the end of this read's requests
  bool closing_ = false;
  bool closed_ = false;
  bool cut_ = false;  // aborted for its backlog: said once
};

class Server::Impl final : public Transport {
 public:
  Impl(asio::io_context& io, ServerOptions options, std::unique_ptr<StateLog> state)
      : io_(io),
        options_(with_worker_store_option(std::move(options))),
        state_(std::move(state)),
        acceptor_(io),
        timer_(io),
        service_(options_.service, clock_, *this) {}

  Status bind() {
    if (auto s = listen_on(acceptor_, options_.host, options_.port); !s) return s;
    const auto local = acceptor_.local_endpoint();
    port_ = local.port();
    address_ = local.address().to_string();
    endpoint_ = endpoint_text(local);
    return ok_status();
  }

  void start() {
    accept();
    arm_timer();
  }

  Status restore() { return service_.restore(); }
  ServiceMetrics metrics() const { return service_.metrics(); }

  void stop() {
    if (stopped_) return;
    stopped_ = true;
    service_.shutdown();
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (auto& [job, acceptor] : worker_store_acceptors_) acceptor->close(ignored);
    worker_store_acceptors_.clear();
    timer_.cancel();
    auto sessions = sessions_;
    for (auto& [id, s] : sessions) s->abort();
  }

  // Transport
  void send(ConnectionId id, std::string bytes) override {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    auto session = it->second;  // may leave the map during the call
    if (!session->send(std::move(bytes))) {
      log(session->peer() + " cut: over " + std::to_string(options_.max_pending_write_bytes) +
          " bytes of answers not read");
    }
  }
  void close(ConnectionId id) override {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    auto session = it->second;
    session->close_after_flush();
  }
  Result<std::uint16_t> open_worker_store(const std::string& job) override {
    const PortRange range = *options_.worker_store_ports;
    Error last{ErrorCode::kInternal, "no port in the range"};
    for (std::uint32_t port = range.first; port <= range.last; ++port) {
      auto acceptor = std::make_shared<tcp::acceptor>(io_);
      if (auto s = listen_on(*acceptor, options_.host, static_cast<std::uint16_t>(port)); !s) {
        last = s.error();
        continue;
      }
      const std::uint16_t bound = acceptor->local_endpoint().port();
      worker_store_acceptors_[job] = acceptor;
      accept(*acceptor, job, acceptor);
      return bound;
    }
    return last;
  }
  void close_worker_store(const std::string& job) override {
    auto it = worker_store_acceptors_.find(job);
    if (it == worker_store_acceptors_.end()) return;
    boost::system::error_code ignored;
    it->second->close(ignored);
    worker_store_acceptors_.erase(it);
  }

  std::uint16_t port_ = 0;
  std::string address_;
  std::string endpoint_;

 private:
  static ServerOptions with_worker_store_option(ServerOptions o) {
    o.service.worker_store_per_job = o.worker_store_ports.has_value();
    return o;
  }

  void accept() { accept(acceptor_, std::nullopt, nullptr); }

  // `worker_store_job`: the acceptor is that job's worker-store port (kept alive by `owner`
  // while its accept loop runs).
  void accept(tcp::acceptor& acceptor, std::optional<std::string> worker_store_job,
              std::shared_ptr<tcp::acceptor> owner) {
    accept_loop(
        acceptor,
        [this, alive = std::weak_ptr<int>(alive_), owner] {
          return !alive.expired() && !stopped_ && (!owner || owner->is_open());
        },
        [this, worker_store_job](tcp::socket socket) {
          boost::system::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);
          std::string peer = endpoint_text(socket.remote_endpoint(ignored));
          const ConnectionId id = next_id_++;
          // torch's TCPStore clients have no TLS: a worker-store port stays plain.
          asio::ssl::context* tls = worker_store_job ? nullptr : options_.tls.get();
          auto session = std::make_shared<Session>(
              TlsStream(std::move(socket), tls), id, service_, options_.max_pending_write_bytes,
              Session::Hooks{[this](ConnectionId gone) { sessions_.erase(gone); },
                             [this](const std::string& peer, const std::string& why) {
                               tls_failed(peer, why);
                             }},
              alive_, read_buffer_);
          session->set_peer(peer);
          sessions_.emplace(id, session);
          service_.on_connect(id, std::move(peer), worker_store_job);
          session->start();
        },
        [this](const std::string& line) { log(line); });
  }

  void arm_timer() {
    timer_.expires_after(options_.tick_interval);
    timer_.async_wait([this, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec) {
      if (ec || alive.expired() || stopped_) return;
      service_.tick();
      arm_timer();
    });
  }

  void log(const std::string& line) {
    if (options_.service.log) options_.service.log(line);
  }

  // One line a second at most: a flood of bad handshakes must not flood the log too.
  void tls_failed(const std::string& peer, const std::string& why) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_tls_failure_logged_ < std::chrono::seconds(1)) {
      ++tls_failures_unlogged_;
      return;
    }
    std::string line = "TLS handshake from " + peer + " failed: " + why;
    if (tls_failures_unlogged_ > 0) {
      line += " (and " + std::to_string(tls_failures_unlogged_) + " more since the last said)";
    }
    log(line);
    last_tls_failure_logged_ = now;
    tls_failures_unlogged_ = 0;
  }

  asio::io_context& io_;
  ServerOptions options_;
  std::unique_ptr<StateLog> state_;  // before service_, which records into it
  SteadyClock clock_;
  tcp::acceptor acceptor_;
  asio::steady_timer timer_;
  Service service_;
  Session::ReadBuffer read_buffer_;  // the plain sessions'
  std::unordered_map<ConnectionId, std::shared_ptr<Session>> sessions_;
  std::unordered_map<std::string, std::shared_ptr<tcp::acceptor>> worker_store_acceptors_;
  ConnectionId next_id_ = 1;
  std::chrono::steady_clock::time_point last_tls_failure_logged_{};
  std::size_t tls_failures_unlogged_ = 0;
  bool stopped_ = false;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

Result<PortRange> parse_port_range(const std::string& text) {
  if (text == "auto") return PortRange{};
  auto bad = [&] {
    return Error{ErrorCode::kBadRequest,
                 "port range '" + text + "': expected auto, PORT or FIRST-LAST (1..65535)"};
  };
  auto number = [](const std::string& s) -> std::optional<std::uint16_t> {
    if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    const long v = std::stol(s);
    if (v < 1 || v > 65535) return std::nullopt;
    return static_cast<std::uint16_t>(v);
  };
  const auto dash = text.find('-');
  auto first = number(text.substr(0, dash));
  auto last = dash == std::string::npos ? first : number(text.substr(dash + 1));
  if (!first || !last || *last < *first) return bad();
  return PortRange{*first, *last};
}

Result<std::unique_ptr<Server>> Server::create(asio::io_context& io, ServerOptions options) {
  if (options.service.open_file_limit == 0) {
    const OpenFileLimit files = open_file_limit();
    if (files.soft != kNoFileLimit) options.service.open_file_limit = files.soft;
  }
  std::unique_ptr<StateLog> state;
  if (!options.state_dir.empty()) {
    auto opened = open_state_dir(options.state_dir);
    if (!opened) return opened.error();
    state = std::move(opened).value();
    options.service.state = state.get();
  }
  auto impl = std::make_unique<Impl>(io, std::move(options), std::move(state));
  if (auto s = impl->bind(); !s) return s.error();
  if (auto s = impl->restore(); !s) return s.error();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { impl_->stop(); }
std::uint16_t Server::port() const { return impl_->port_; }
const std::string& Server::address() const { return impl_->address_; }
const std::string& Server::endpoint() const { return impl_->endpoint_; }
void Server::start() { impl_->start(); }
void Server::stop() { impl_->stop(); }
ServiceMetrics Server::metrics() const { return impl_->metrics(); }

}  // namespace ctrun::rendezvous
