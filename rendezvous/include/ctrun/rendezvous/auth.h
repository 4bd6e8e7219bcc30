// Shared-token authentication by HMAC challenge: the token itself never crosses the wire.
//   daemon -> client: a fresh random nonce per connection
//   client -> daemon: HMAC(token, "ctrun-client" | server nonce | job), and a nonce of its own
//   daemon -> client: HMAC(token, "ctrun-server" | client nonce | server nonce)
// A proof is bound to one connection's nonce, so a recorded proof is useless on another one.
#pragma once

#include <cstddef>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

inline constexpr std::size_t kNonceBytes = 32;

std::string random_bytes(std::size_t n);
std::string client_proof(const std::string& token, const std::string& server_nonce,
                         const std::string& job);
std::string server_proof(const std::string& token, const std::string& client_nonce,
                         const std::string& server_nonce);
bool constant_time_equal(const std::string& a, const std::string& b);
// Reads a token file: its content less trailing whitespace; an error when unreadable or empty.
Result<std::string> read_token_file(const std::string& path);

}  // namespace ctrun::rendezvous
