// A TCP connection that runs TLS when made with a context and is plain otherwise: one type for
// the daemon's sessions and the AsyncClient, whichever the deployment chose. The async
// operations take any completion token and go to the TLS stream or straight to the socket.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include <memory>
#include <utility>

namespace ctrun::rendezvous {

class TlsStream {
 public:
  using Socket = boost::asio::ip::tcp::socket;
  using Tls = boost::asio::ssl::stream<Socket>;

  // `tls` null: plain TCP. The context must outlive the stream.
  TlsStream(Socket socket, boost::asio::ssl::context* tls)
      : plain_(socket.get_executor()),
        tls_(tls != nullptr ? std::make_unique<Tls>(std::move(socket), *tls) : nullptr) {
    if (!tls_) plain_ = std::move(socket);
  }

  bool tls() const { return tls_ != nullptr; }
  Socket& socket() { return tls_ ? tls_->next_layer() : plain_; }
  const Socket& socket() const { return tls_ ? tls_->next_layer() : plain_; }
  SSL* ssl() { return tls_ ? tls_->native_handle() : nullptr; }

  template <typename Token>
  auto async_handshake(boost::asio::ssl::stream_base::handshake_type type, Token&& token) {
    return tls_->async_handshake(type, std::forward<Token>(token));
  }

  template <typename Buffers, typename Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    if (tls_) return tls_->async_read_some(buffers, std::forward<Token>(token));
    return plain_.async_read_some(buffers, std::forward<Token>(token));
  }

  // Writes all of `buffers` (boost::asio::async_write on the right layer).
  template <typename Buffers, typename Token>
  auto async_write(const Buffers& buffers, Token&& token) {
    if (tls_) return boost::asio::async_write(*tls_, buffers, std::forward<Token>(token));
    return boost::asio::async_write(plain_, buffers, std::forward<Token>(token));
  }

  // Closes the TCP connection at once (no TLS close_notify: every peer of ours treats the end
  // of the stream as the end, and a closing daemon must not wait on a client).
  void close() {
    boost::system::error_code ignored;
    socket().cancel(ignored);
    socket().shutdown(Socket::shutdown_both, ignored);
    socket().close(ignored);
  }

 private:
  Socket plain_;
  std::unique_ptr<Tls> tls_;
};

}  // namespace ctrun::rendezvous
