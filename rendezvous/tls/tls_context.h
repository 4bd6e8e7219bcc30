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

// Readies `ssl` (a stream's native handle) to connect to `host`: SNI for a name, and the
// server's certificate checked to name `host` (a name, or an IP address).
void expect_server_name(SSL* ssl, const std::string& host);

// Why a handshake on `ssl` failed with `ec`: the certificate check's reason when it failed there
// ("certificate has expired", "unable to get local issuer certificate: the server's certificate
// is not signed by a CA given", "hostname mismatch"), else what OpenSSL said, with a hint where
// the cause is plain ("the server does not speak TLS", "closed the connection in the
// handshake ...: is it a plain http:// endpoint?").
std::string handshake_failure(SSL* ssl, const boost::system::error_code& ec);

}  // namespace ctrun::rendezvous
