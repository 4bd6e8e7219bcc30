#include "rendezvous/base/local_address.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

namespace ctrun::rendezvous {

Result<std::string> local_address_towards(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return Error{ErrorCode::kBadRequest,
                 "cannot resolve its name: " + std::string(gai_strerror(rc))};
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(found, freeaddrinfo);
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    ::close(fd);
    if (!ok) continue;
    char text[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof(text), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      return std::string(text);
    }
  }
  return Error{ErrorCode::kBadRequest, "no route from this machine to it"};
}

}  // namespace ctrun::rendezvous
