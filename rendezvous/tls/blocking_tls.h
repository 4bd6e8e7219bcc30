// TLS over a connected, non-blocking socket for a caller that blocks in its own thread and
// bounds every wait with poll() (the blocking Client): OpenSSL's calls retried on
// WANT_READ/WANT_WRITE until a deadline.
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace boost::asio::ssl {
class context;
}

namespace ctrun::rendezvous {

// Waits (poll(), again after EINTR) until `fd` is ready for `events`: ok; kTimeout once
// `deadline` passes (time_point::max(): no deadline); kConnection with errno's words.
Status wait_until_ready(int fd, short events, std::chrono::steady_clock::time_point deadline);

class BlockingTls {
 public:
  using Clock = std::chrono::steady_clock;

  // Runs the client's handshake on `fd` with `context`, checking the server's certificate names
  // `host`. An error is one line (handshake_failure's) naming the cause; kTimeout after
  // `deadline`. `plain_hint` is asked when the server does not speak TLS.
  static Result<std::unique_ptr<BlockingTls>> connect(boost::asio::ssl::context& context, int fd,
                                                      const std::string& host,
                                                      Clock::time_point deadline,
                                                      const std::string& plain_hint);
  ~BlockingTls();
  BlockingTls(const BlockingTls&) = delete;
  BlockingTls& operator=(const BlockingTls&) = delete;

  // Writes all `n` bytes, or fails (kTimeout after `deadline`, kConnection otherwise).
  Status write_all(const char* data, std::size_t n, Clock::time_point deadline);
  // Reads what is there (waiting for something until `deadline`): the count, 0 when the peer
  // closed, or the error. A TLS alert (a refused client certificate under TLS 1.3 arrives
  // here, after the handshake) is said as handshake_failure says it.
  Result<std::size_t> read_some(char* data, std::size_t n, Clock::time_point deadline);

 private:
  BlockingTls(SSL* ssl, int fd, std::string plain_hint);
  // For a call that returned `ret`: waits as OpenSSL asks and says to retry (ok), or the error.
  Status wait_or_fail(int ret, Clock::time_point deadline, bool in_handshake);

  SSL* ssl_;
  int fd_;
  std::string plain_hint_;
};

}  // namespace ctrun::rendezvous
