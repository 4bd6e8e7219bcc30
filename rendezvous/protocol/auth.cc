#include "rendezvous/protocol/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <stdexcept>

namespace ctrun::rendezvous {
namespace {

std::string hmac_sha256(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &out_len);
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

}  // namespace

std::string client_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& job) {
  return hmac_sha256(token, std::string("ctrun-client", 13) + server_nonce + job);
}

std::string server_proof(const std::string& token, const std::string& client_nonce,
                         const std::string& server_nonce) {
  return hmac_sha256(token, std::string("ctrun-server", 13) + client_nonce + server_nonce);
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ctrun::rendezvous
