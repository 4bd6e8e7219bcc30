// The disk_full fault's fill, on a small tmpfs of the test's own (a mount namespace of its own,
// so that nothing is mounted where the machine sees it). Needs root.
#include "launcher/faults/disk_fill.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "catch.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::launcher;
using ctrun::testing::ScratchDir;

namespace {
// Writes `bytes` to a new file in `dir`; errno of the first failed write, 0 if all went.
int write_file(const std::string& path, std::size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  const std::vector<char> data(bytes, 'x');
  const ssize_t n = ::write(fd, data.data(), data.size());
  const int error = n == static_cast<ssize_t>(bytes) ? 0 : (n < 0 ? errno : ENOSPC);
  const int closed = ::close(fd) == 0 ? 0 : errno;
  return error != 0 ? error : closed;
}
}  // namespace

TEST_CASE("disk fill: the directory's filesystem is full until the fill is freed") {
  if (::geteuid() != 0) CTRUN_SKIP("needs root to mount a small tmpfs of its own");
  ScratchDir s("disk_fill");
  const std::string dir = s.path("ckpt");
  std::filesystem::create_directories(dir);
  REQUIRE(write_file(dir + "/old.ckpt", 4096) == 0);
  // This test process's own mount namespace: the tmpfs is seen by nobody else and goes with it.
  REQUIRE(::unshare(CLONE_NEWNS) == 0);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    REQUIRE(errno == EINVAL);
    CTRUN_SKIP("cannot make the mounts private: '/' is not a mount point here (a chroot?)");
  }
  REQUIRE(::mount("ctrun-test", dir.c_str(), "tmpfs", 0, "size=8m") == 0);
  REQUIRE(write_file(dir + "/before.ckpt", 1 << 20) == 0);

  auto fill = fill_disk(dir, 7);
  REQUIRE(fill);
  CHECK(fill.value().file == dir + "/.ctrun-fault-7.fill");
  CHECK(fill.value().bytes > (6u << 20));
  CHECK(write_file(dir + "/during.ckpt", 64 << 10) == ENOSPC);
  CHECK(std::filesystem::file_size(dir + "/before.ckpt") == (1u << 20));  // untouched

  REQUIRE(free_disk(fill.value()));
  CHECK_FALSE(std::filesystem::exists(fill.value().file));
  CHECK(write_file(dir + "/after.ckpt", 1 << 20) == 0);
  CHECK(::umount(dir.c_str()) == 0);

  // A directory that is not there: one line naming it.
  auto missing = fill_disk(s.path("nowhere"), 1);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("cannot create '" + s.path("nowhere") +
                                     "/.ctrun-fault-1.fill'") == 0);
}
