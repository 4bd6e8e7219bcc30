#include "rendezvous/tls/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ssl/error.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ctrun::rendezvous {

namespace asio = boost::asio;

namespace {

// OpenSSL's reason for the last failure, without its library prefix.
std::string openssl_reason() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  const char* reason = ERR_reason_error_string(e);
  return reason != nullptr ? reason : "error " + std::to_string(e);
}

// The file must be readable; OpenSSL's own words for an unreadable one are vague.
Status readable(const std::string& what, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Error{ErrorCode::kBadRequest, what + " '" + path + "': " + std::strerror(errno)};
  }
  std::fclose(f);
  return ok_status();
}

// Loads a certificate chain and its private key into `native`, each file named by its label in
// an error ("--tls_cert '/x': No such file or directory", "key file '/k' (for '/c')").
Status use_certificate(SSL_CTX* native, const std::string& cert_label, const std::string& cert,
                       const std::string& key_label, const std::string& key) {
  auto fail = [](const std::string& what, const std::string& path) {
    return Error{ErrorCode::kBadRequest, what + " '" + path + "': " + openssl_reason()};
  };
  if (auto s = readable(cert_label, cert); !s) return s;
  if (auto s = readable(key_label, key); !s) return s;
  if (SSL_CTX_use_certificate_chain_file(native, cert.c_str()) != 1) return fail(cert_label, cert);
  if (SSL_CTX_use_PrivateKey_file(native, key.c_str(), SSL_FILETYPE_PEM) != 1) {
    return fail(key_label, key);
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    return fail(key_label, key + "' (for '" + cert + "')");
  }
  return ok_status();
}

}  // namespace

Result<std::shared_ptr<asio::ssl::context>> make_client_tls_context(const TlsClientFiles& files) {
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  auto fail = [](const std::string& what, const std::string& path) {
    return Error{ErrorCode::kBadRequest, what + " '" + path + "': " + openssl_reason()};
  };
  if (files.ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(native) != 1) {
      return Error{ErrorCode::kBadRequest, "the system's CA certificates: " + openssl_reason()};
    }
  } else {
    if (auto s = readable("CA file", files.ca_file); !s) return s.error();
    if (SSL_CTX_load_verify_locations(native, files.ca_file.c_str(), nullptr) != 1) {
      return fail("CA file", files.ca_file);
    }
  }
  if (files.cert_file.empty() != files.key_file.empty()) {
    return Error{ErrorCode::kBadRequest,
                 "a client certificate needs both its certificate file and its key file"};
  }
  if (!files.cert_file.empty()) {
    if (auto s = use_certificate(native, "certificate file", files.cert_file, "key file",
                                 files.key_file);
        !s) {
      return s.error();
    }
  }
  return context;
}

Result<std::shared_ptr<asio::ssl::context>> make_server_tls_context(const TlsServerFiles& files) {
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  auto fail = [](const std::string& what, const std::string& path) {
    return Error{ErrorCode::kBadRequest, what + " '" + path + "': " + openssl_reason()};
  };
  if (files.cert_file.empty() || files.key_file.empty()) {
    return Error{ErrorCode::kBadRequest, "TLS needs both --tls_cert and --tls_key"};
  }
  if (auto s = use_certificate(native, "--tls_cert", files.cert_file, "--tls_key", files.key_file);
      !s) {
    return s.error();
  }
  if (!files.client_ca_file.empty()) {
    if (auto s = readable("--tls_client_ca", files.client_ca_file); !s) return s.error();
    if (SSL_CTX_load_verify_locations(native, files.client_ca_file.c_str(), nullptr) != 1) {
      return fail("--tls_client_ca", files.client_ca_file);
    }
    // The CA's name goes in the certificate request: a client with several picks the right one.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca_file.c_str());
    if (names != nullptr) SSL_CTX_set_client_CA_list(native, names);
    SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  ERR_clear_error();
  return context;
}

void expect_server_name(SSL* ssl, const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (!ec) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());  // no SNI for an address (RFC 6066)
  } else {
    SSL_set_tlsext_host_name(ssl, host.c_str());
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  }
}

bool handshake_may_pass_later(const boost::system::error_code& ec) {
  return ec == asio::ssl::error::stream_truncated || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
}

std::string handshake_failure(SSL* ssl, const boost::system::error_code& ec,
                              const std::string& plain_hint) {
  const long verified = SSL_get_verify_result(ssl);
  ERR_clear_error();
  if (verified != X509_V_OK) {
    std::string why = X509_verify_cert_error_string(verified);
    switch (verified) {
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
        why += " (the server's certificate is not signed by a CA given: check cacert)";
        break;
      case X509_V_ERR_CERT_HAS_EXPIRED:
      case X509_V_ERR_CERT_NOT_YET_VALID:
        why += " (the server's certificate)";
        break;
      case X509_V_ERR_HOSTNAME_MISMATCH:
      case X509_V_ERR_IP_ADDRESS_MISMATCH:
        why += " (the server's certificate names another host)";
        break;
      default:
        break;
    }
    return "TLS handshake failed: certificate verify failed: " + why;
  }
  const std::string message = ec.message();
  if (message.find("wrong version number") != std::string::npos ||
      message.find("packet length too long") != std::string::npos) {
    return "TLS handshake failed: the server does not speak TLS (" + message + "): " + plain_hint;
  }
  if (ec == asio::ssl::error::stream_truncated || ec == asio::error::eof ||
      ec == asio::error::connection_reset) {
    return "TLS handshake failed: the server closed the connection in the handshake (" + message +
           "): " + plain_hint;
  }
  if (message.find("alert certificate required") != std::string::npos ||
      message.find("alert handshake failure") != std::string::npos ||
      message.find("alert bad certificate") != std::string::npos ||
      message.find("alert unknown ca") != std::string::npos ||
      message.find("alert certificate expired") != std::string::npos) {
    return "TLS handshake failed: the server refused this client's certificate (" + message +
           "): check cert and key";
  }
  return "TLS handshake failed: " + message;
}

std::string server_handshake_failure(SSL* ssl, const boost::system::error_code& ec) {
  const long verified = SSL_get_verify_result(ssl);
  ERR_clear_error();
  if (verified != X509_V_OK) {
    return std::string("client certificate: ") + X509_verify_cert_error_string(verified);
  }
  const std::string message = ec.message();
  if (message.find("peer did not return a certificate") != std::string::npos) {
    return "the client presented no certificate (--tls_client_ca asks for one)";
  }
  if (message.find("wrong version number") != std::string::npos ||
      message.find("http request") != std::string::npos) {
    return "the client does not speak TLS (" + message + ")";
  }
  return message;
}

}  // namespace ctrun::rendezvous
