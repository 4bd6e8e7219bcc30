#include "launcher/faults/disk_fill.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ctrun::launcher {

namespace rdzv = rendezvous;

namespace {

rdzv::Error failure(const std::string& what) {
  return {rdzv::ErrorCode::kInternal, what + ": " + std::strerror(errno)};
}

// Takes up to `bytes` at `offset`; how many it took.
std::uint64_t take(int fd, std::uint64_t offset, std::uint64_t bytes) {
  if (::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(bytes)) == 0) return bytes;
  if (errno != EOPNOTSUPP) return 0;
  // A filesystem without fallocate: written, a MiB at a time.
  static const std::vector<char> zeros(1 << 20);
  std::uint64_t done = 0;
  while (done < bytes) {
    const auto n = ::pwrite(fd, zeros.data(), std::min<std::uint64_t>(zeros.size(), bytes - done),
                            static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  return done;
}

}  // namespace

rdzv::Result<DiskFill> fill_disk(const std::string& dir, int fault_id) {
  DiskFill fill;
  fill.file = dir + "/.ctrun-fault-" + std::to_string(fault_id) + ".fill";
  const int fd = ::open(fill.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return failure("cannot create '" + fill.file + "'");
  struct statvfs fs {};
  if (::fstatvfs(fd, &fs) != 0) {
    const auto error = failure("cannot read the filesystem of '" + dir + "'");
    ::close(fd);
    ::unlink(fill.file.c_str());
    return error;
  }
  // Root may write into the blocks kept for it (f_bfree), and so may a worker running as root:
  // take those too.
  std::uint64_t left =
      static_cast<std::uint64_t>(::geteuid() == 0 ? fs.f_bfree : fs.f_bavail) * fs.f_frsize;
  // Asked for at once, then in ever smaller pieces: the free count is an estimate (metadata
  // takes blocks too), and whatever remains must go.
  for (std::uint64_t piece = left; piece >= 4096;) {
    const std::uint64_t got = take(fd, fill.bytes, piece);
    fill.bytes += got;
    if (got == 0) piece /= 2;
  }
  ::close(fd);
  return fill;
}

rdzv::Status free_disk(const DiskFill& fill) {
  if (::unlink(fill.file.c_str()) != 0 && errno != ENOENT) {
    return failure("cannot remove '" + fill.file + "'");
  }
  return rdzv::ok_status();
}

}  // namespace ctrun::launcher
