#include "launcher/workers/heartbeat_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace ctrun::launcher {

std::int64_t modification_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

const std::string* HeartbeatFiles::path_of(int local_rank) const {
  const auto slot = static_cast<std::size_t>(local_rank);
  if (local_rank < 0 || slot >= paths_.size() || paths_[slot].empty()) return nullptr;
  return &paths_[slot];
}

bool HeartbeatFiles::create(int local_rank, const std::string& path) {
  const auto slot = static_cast<std::size_t>(local_rank);
  if (local_rank < 0) return false;
  if (slot >= paths_.size()) paths_.resize(slot + 1);
  paths_[slot] = path;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

std::optional<HeartbeatFiles::Progress> parse_progress(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const long long step = std::strtoll(begin, &end, 10);
  if (end == begin) return std::nullopt;
  HeartbeatFiles::Progress p;
  p.step = static_cast<std::int64_t>(step);
  if (*end == ' ') {
    const char* at = end + 1;
    const long long waited = std::strtoll(at, &end, 10);
    const bool number = end != at && *at != ' ';
    while (*end == ' ') ++end;  // a record padded to its width
    if (number && waited >= 0 && (*end == '\n' || *end == '\0')) {
      p.waited_ns = static_cast<std::int64_t>(waited);
    }
  }
  return p;
}

std::optional<HeartbeatFiles::Progress> HeartbeatFiles::progress(int local_rank) const {
  const std::string* path = path_of(local_rank);
  if (!path) return std::nullopt;
  const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[64];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return parse_progress(std::string(text, static_cast<std::size_t>(n)));
}

std::int64_t HeartbeatFiles::stamp(int local_rank) const {
  const std::string* path = path_of(local_rank);
  return path ? modification_stamp(*path) : 0;
}

std::vector<std::int64_t> HeartbeatFiles::stamps() const {
  std::vector<std::int64_t> out;
  for (int i = 0; i < size(); ++i) out.push_back(stamp(i));
  return out;
}

}  // namespace ctrun::launcher
