// Shared-token authentication by HMAC challenge: the token itself never crosses the wire.
//   daemon -> client: a fresh random nonce per connection
//   client -> daemon: HMAC-SHA256(token, "ctrun-client\0" | server nonce | job), and a nonce
//   daemon -> client: HMAC-SHA256(token, "ctrun-server\0" | client nonce | server nonce)
// The labels (with their NUL terminator) keep one side's proof from being reflected as the
// other's. A proof is bound to one connection's nonce, so a recorded proof is useless later.
#pragma once

#include <cstddef>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "rendezvous/base/random.h"  // the nonces

namespace ctrun::rendezvous {

inline constexpr std::size_t kNonceBytes = 32;

std::string client_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& job);
std::string server_proof(const std::string& token, const std::string& client_nonce,
                         const std::string& server_nonce);
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace ctrun::rendezvous
