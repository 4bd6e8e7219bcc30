#include "rendezvous/tls/blocking_tls.h"

#include <openssl/err.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <boost/asio/error.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rendezvous/tls/tls_context.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;

namespace {

// OpenSSL writes to the socket with write(), which raises SIGPIPE on a connection the peer
// closed; a worker that links this must not die of it. SIGPIPE is blocked in this thread while
// OpenSSL runs, and one it raised is taken back before it is unblocked (as libpq does).
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlocked() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{};
      while (sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace

Status wait_until_ready(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  while (true) {
    int wait_ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Error{ErrorCode::kTimeout, "timed out"};
      wait_ms = static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1 << 30));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, wait_ms);
    if (n > 0) return ok_status();
    if (n < 0 && errno != EINTR) return Error{ErrorCode::kConnection, std::strerror(errno)};
  }
}

Result<std::unique_ptr<BlockingTls>> BlockingTls::connect(asio::ssl::context& context, int fd,
                                                          const std::string& host,
                                                          Clock::time_point deadline,
                                                          const std::string& plain_hint) {
  SSL* ssl = SSL_new(context.native_handle());
  if (ssl == nullptr) return Error{ErrorCode::kInternal, "TLS: cannot make a connection"};
  std::unique_ptr<BlockingTls> tls(new BlockingTls(ssl, fd, plain_hint));
  SSL_set_fd(ssl, fd);
  expect_server_name(ssl, host);
  while (true) {
    ERR_clear_error();
    const SigpipeBlocked quiet;
    const int ret = SSL_connect(ssl);
    if (ret == 1) return tls;
    if (auto s = tls->wait_or_fail(ret, deadline, true); !s) return s.error();
  }
}

BlockingTls::BlockingTls(SSL* ssl, int fd, std::string plain_hint)
    : ssl_(ssl), fd_(fd), plain_hint_(std::move(plain_hint)) {}

BlockingTls::~BlockingTls() { SSL_free(ssl_); }

Status BlockingTls::write_all(const char* data, std::size_t n, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < n) {
    ERR_clear_error();
    const SigpipeBlocked quiet;
    const int ret = SSL_write(
        ssl_, data + sent, static_cast<int>(std::min<std::size_t>(n - sent, std::size_t{1} << 30)));
    if (ret > 0) {
      sent += static_cast<std::size_t>(ret);
      continue;
    }
    if (auto s = wait_or_fail(ret, deadline, false); !s) return s;
  }
  return ok_status();
}

Result<std::size_t> BlockingTls::read_some(char* data, std::size_t n, Clock::time_point deadline) {
  while (true) {
    ERR_clear_error();
    const SigpipeBlocked quiet;
    const int ret = SSL_read(ssl_, data, static_cast<int>(std::min<std::size_t>(n, 1 << 30)));
    if (ret > 0) return static_cast<std::size_t>(ret);
    if (SSL_get_error(ssl_, ret) == SSL_ERROR_ZERO_RETURN) return std::size_t{0};
    if (auto s = wait_or_fail(ret, deadline, false); !s) return s.error();
  }
}

Status BlockingTls::wait_or_fail(int ret, Clock::time_point deadline, bool in_handshake) {
  const int error = SSL_get_error(ssl_, ret);
  short events = 0;
  if (error == SSL_ERROR_WANT_READ) events = POLLIN;
  if (error == SSL_ERROR_WANT_WRITE) events = POLLOUT;
  if (events != 0) return wait_until_ready(fd_, events, deadline);
  // As Asio says it, so that handshake_failure reads one kind of error code either way.
  boost::system::error_code ec;
  if (error == SSL_ERROR_SSL) {
    ec.assign(static_cast<int>(ERR_peek_last_error()), asio::error::get_ssl_category());
  } else if (error == SSL_ERROR_SYSCALL && errno != 0 && ERR_peek_last_error() == 0) {
    ec.assign(errno, boost::system::system_category());
  } else {
    ec = asio::ssl::error::stream_truncated;
  }
  const std::string alert = ec.message();
  const bool refused = alert.find("alert") != std::string::npos;
  if (in_handshake || (refused && error == SSL_ERROR_SSL)) {
    const ErrorCode code =
        handshake_may_pass_later(ec) ? ErrorCode::kConnection : ErrorCode::kAuthFailed;
    return Error{code, handshake_failure(ssl_, ec, plain_hint_)};
  }
  if (ec == asio::ssl::error::stream_truncated) {
    return Error{ErrorCode::kConnection, "closed by the peer"};
  }
  return Error{ErrorCode::kConnection, alert};
}

}  // namespace ctrun::rendezvous
