// TLS contexts for ctrun's connections, made from the files a user names, and a failed handshake
// said in one line that names its cause. OpenSSL through Boost.Asio.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream_base.hpp>
#include <boost/system/error_code.hpp>

#include <memory>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/tls.h"

namespace ctrun::rendezvous {

// A client's context (TLS 1.2 and later): servers verified against files.ca_file (the system's
// CAs when empty), files.cert_file and key_file presented when given. An error names the file
// and what is wrong with it ("--rdzv_conf cacert '/x': No such file or directory").
Result<std::shared_ptr<boost::asio::ssl::context>> make_client_tls_context(
    const TlsClientFiles& files);

// What a TLS server presents and whom it lets in (ctrund --tls_cert, --tls_key,
// --tls_client_ca).
struct TlsServerFiles {
  std::string cert_file;       // the server's certificate chain (PEM)
  std::string key_file;        // its private key (PEM)
  std::string client_ca_file;  // set: mutual TLS, a client must present a certificate it signed
};

// A server's context (TLS 1.2 and later). An error names the flag's file and what is wrong.
Result<std::shared_ptr<boost::asio::ssl::context>> make_server_tls_context(
    const TlsServerFiles& files);

// Readies `ssl` (a stream's native handle) to connect to `host`: SNI for a name, and the
// server's certificate checked to name `host` (a name, or an IP address).
void expect_server_name(SSL* ssl, const std::string& host);

// Why a handshake on `ssl` failed with `ec`: the certificate check's reason when it failed there
// ("certificate has expired", "unable to get local issuer certificate: the server's certificate
// is not signed by a CA given", "hostname mismatch"), else what OpenSSL said, with a hint where
// the cause is plain ("the server does not speak TLS", "closed the connection in the
// handshake ...: is it a plain http:// endpoint?").
// Whether a handshake that failed with `ec` may pass when tried again: the connection was
// closed or reset in it (a server at its connection limit, or restarting). A certificate
// refused, or a server that does not speak TLS, will fail the same way again.
bool handshake_may_pass_later(const boost::system::error_code& ec);

// `plain_hint` is asked when the server seems not to speak TLS at all.
std::string handshake_failure(SSL* ssl, const boost::system::error_code& ec,
                              const std::string& plain_hint = "is it a plain http:// endpoint?");

// Why a client's handshake with this server failed, for the server's log: the client
// certificate's check ("client certificate: certificate has expired"), a client that sent no
// certificate, or what OpenSSL said.
std::string server_handshake_failure(SSL* ssl, const boost::system::error_code& ec);

}  // namespace ctrun::rendezvous
