#include "launcher/workers/filtered_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "launcher/workers/output_sink.h"

namespace ctrun::launcher {

rendezvous::Result<std::shared_ptr<FilteredLog>> FilteredLog::open(
    const std::string& path, std::vector<std::string> filters) {
  // O_APPEND: a group being stopped may still copy its last lines through an earlier open of
  // this path (a re-form keeps the attempt number); they land at the end, not over a hole.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return rendezvous::Error{rendezvous::ErrorCode::kBadRequest,
                             "cannot open log file '" + path + "': " + std::strerror(errno)};
  }
  // The constructor is private: make_shared cannot reach it.
  return std::shared_ptr<FilteredLog>(new FilteredLog(fd, path, std::move(filters)));
}

FilteredLog::FilteredLog(int fd, std::string path, std::vector<std::string> filters)
    : fd_(fd), path_(std::move(path)), filters_(std::move(filters)) {}

FilteredLog::~FilteredLog() {
  if (fd_ >= 0) ::close(fd_);
}

bool FilteredLog::matches(std::string_view line) const {
  return std::any_of(filters_.begin(), filters_.end(), [line](const std::string& filter) {
    return line.find(filter) != std::string_view::npos;
  });
}

void FilteredLog::offer(std::string_view prefix, std::string_view line) {
  if (fd_ < 0 || !matches(line)) return;
  std::string out;
  out.reserve(prefix.size() + line.size() + 1);
  out.append(prefix);
  out.append(line);
  if (out.empty() || out.back() != '\n') out += '\n';
  // A full disk or a removed directory costs this copy only; the console and the per-rank
  // files go on, as they do when their own writes fail.
  if (write_all(fd_, out.data(), out.size())) return;
  const int error = errno;
  ::close(fd_);
  fd_ = -1;
  if (on_file_error_) on_file_error_(path_, error);
}

}  // namespace ctrun::launcher
