#include "rendezvous/base/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ctrun::rendezvous {

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  std::size_t filled = 0;
  while (filled < n) {
    const ssize_t got = ::getrandom(out.data() + filled, n - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    }
    filled += static_cast<std::size_t>(got);
  }
  return out;
}

std::string random_hex(std::size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char c : random_bytes(bytes)) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace ctrun::rendezvous
