// Test helper: certificates made on the spot with OpenSSL (EC P-256 keys), as PEM files in a
// scratch directory: a CA, and certificates it signs for servers and clients, valid now or not.
#pragma once

#include <string>
#include <vector>

namespace ctrun::testing {

struct CertFiles {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key
};

// A self-signed CA named `name`: DIR/name.pem and DIR/name.key.
CertFiles make_ca(const std::string& dir, const std::string& name);

struct CertSpec {
  std::string name;                // the file names' stem and the subject's CN
  std::vector<std::string> hosts;  // subjectAltName: IP addresses and DNS names
  bool client = false;             // clientAuth usage only (else serverAuth and clientAuth)
  long valid_from = -3600;         // seconds from now
  long valid_to = 86400;           // seconds from now
};

// A certificate `spec` describes, signed by `ca`: DIR/<name>.pem and DIR/<name>.key.
CertFiles issue_cert(const std::string& dir, const CertFiles& ca, const CertSpec& spec);

// The TLS tests' certificates, under DIR: a CA; a server certificate for 127.0.0.1 and
// localhost, and one variant per bad case (expired, not yet valid, naming another host); a
// client certificate; a second CA and a client certificate it signed (one no server trusts).
struct TestPki {
  explicit TestPki(const std::string& dir);
  // --rdzv_conf's TLS keys for a client trusting `trusted`, presenting `client` unless told
  // not to.
  std::string rdzv_conf(const CertFiles& trusted, bool with_client_cert = true) const;
  std::string dir;
  CertFiles ca, other_ca, server, expired, future, elsewhere, client, stranger;
};

}  // namespace ctrun::testing
