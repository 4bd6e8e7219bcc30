// Random bytes from the kernel (getrandom(2)): nonces, node ids, run ids, unique key names.
// Part of the basics, so that a part needing an id does not reach into the authentication code.
#pragma once

#include <cstddef>
#include <string>

namespace ctrun::rendezvous {

// `n` bytes fit for secrets (the handshake's nonces).
std::string random_bytes(std::size_t n);
// `bytes` random bytes as 2*`bytes` lowercase hex digits.
std::string random_hex(std::size_t bytes);

}  // namespace ctrun::rendezvous
