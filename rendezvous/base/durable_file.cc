#include "rendezvous/base/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ctrun::rendezvous {

namespace {

Error os_error(const std::string& what, const std::string& path) {
  return Error{ErrorCode::kInternal, what + " '" + path + "': " + std::strerror(errno)};
}

}  // namespace

Status write_fully(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("cannot write", path);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return ok_status();
}

Status sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open", dir);
  const int rc = ::fsync(fd);
  Status s = rc == 0 ? ok_status() : Status(os_error("cannot sync", dir));
  ::close(fd);
  return s;
}

}  // namespace ctrun::rendezvous
