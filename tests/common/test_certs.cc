#include "test_certs.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace ctrun::testing {
namespace {

EVP_PKEY* new_key() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) throw std::runtime_error("test certs: cannot make a key");
  return key;
}

void write_pem(const std::string& path, EVP_PKEY* key, X509* cert) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("test certs: cannot write " + path);
  const bool ok = key ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1
                      : PEM_write_X509(f, cert) == 1;
  std::fclose(f);
  if (!ok) throw std::runtime_error("test certs: cannot write " + path);
}

template <class T>
T* read_pem(const std::string& path, T* (*reader)(std::FILE*, T**, pem_password_cb*, void*)) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("test certs: cannot read " + path);
  T* out = reader(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (out == nullptr) throw std::runtime_error("test certs: not PEM: " + path);
  return out;
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) throw std::runtime_error("test certs: bad extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` named `cn`, valid [from, to] seconds from now, issued by `issuer`
// (itself when null); signed by the caller.
X509* new_cert(EVP_PKEY* key, const std::string& cn, long from, long to, X509* issuer) {
  static long serial = 1;
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert), from);
  X509_gmtime_adj(X509_getm_notAfter(cert), to);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : name);
  return cert;
}

}  // namespace

CertFiles make_ca(const std::string& dir, const std::string& name) {
  EVP_PKEY* key = new_key();
  X509* cert = new_cert(key, name, -3600, 10 * 86400, nullptr);
  add_extension(cert, cert, NID_basic_constraints, "critical,CA:TRUE");
  add_extension(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert, cert, NID_subject_key_identifier, "hash");
  X509_sign(cert, key, EVP_sha256());
  CertFiles files{dir + "/" + name + ".pem", dir + "/" + name + ".key"};
  write_pem(files.cert, nullptr, cert);
  write_pem(files.key, key, nullptr);
  X509_free(cert);
  EVP_PKEY_free(key);
  return files;
}

CertFiles issue_cert(const std::string& dir, const CertFiles& ca, const CertSpec& spec) {
  X509* ca_cert = read_pem<X509>(ca.cert, PEM_read_X509);
  EVP_PKEY* ca_key = read_pem<EVP_PKEY>(ca.key, PEM_read_PrivateKey);
  EVP_PKEY* key = new_key();
  X509* cert = new_cert(key, spec.name, spec.valid_from, spec.valid_to, ca_cert);
  add_extension(cert, ca_cert, NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert, ca_cert, NID_key_usage, "critical,digitalSignature,keyEncipherment");
  // A server's may serve as a client too: etcd's gateway reaches its own gRPC side with the
  // server's certificate, and under --client-cert-auth that needs clientAuth.
  add_extension(cert, ca_cert, NID_ext_key_usage,
                spec.client ? "clientAuth" : "serverAuth,clientAuth");
  std::string sans;
  for (const auto& host : spec.hosts) {
    unsigned char buf[16];
    const bool ip =
        inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
    sans += (sans.empty() ? "" : ",") + std::string(ip ? "IP:" : "DNS:") + host;
  }
  if (!sans.empty()) add_extension(cert, ca_cert, NID_subject_alt_name, sans);
  X509_sign(cert, ca_key, EVP_sha256());
  CertFiles files{dir + "/" + spec.name + ".pem", dir + "/" + spec.name + ".key"};
  write_pem(files.cert, nullptr, cert);
  write_pem(files.key, key, nullptr);
  X509_free(cert);
  X509_free(ca_cert);
  EVP_PKEY_free(key);
  EVP_PKEY_free(ca_key);
  return files;
}

TestPki::TestPki(const std::string& d) : dir(d) {
  std::filesystem::create_directories(dir);
  ca = make_ca(dir, "ca");
  other_ca = make_ca(dir, "other-ca");
  server = issue_cert(dir, ca, {"server", {"127.0.0.1", "localhost"}});
  expired = issue_cert(dir, ca, {"expired", {"127.0.0.1"}, false, -7200, -3600});
  future = issue_cert(dir, ca, {"future", {"127.0.0.1"}, false, 3600, 7200});
  elsewhere = issue_cert(dir, ca, {"elsewhere", {"10.1.2.3", "elsewhere.example"}});
  client = issue_cert(dir, ca, {"client", {}, true});
  stranger = issue_cert(dir, other_ca, {"stranger", {}, true});
}

std::string TestPki::rdzv_conf(const CertFiles& trusted, bool with_client_cert) const {
  std::string c = "cacert=" + trusted.cert;
  if (with_client_cert) c += ",cert=" + client.cert + ",key=" + client.key;
  return c;
}

}  // namespace ctrun::testing
