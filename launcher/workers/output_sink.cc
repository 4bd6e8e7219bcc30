#include "launcher/workers/output_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "launcher/workers/filtered_log.h"

namespace ctrun::launcher {

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

OutputSink::OutputSink(int console_fd, std::string prefix, const std::string& file_path,
                       std::shared_ptr<FilteredLog> filtered)
    : console_fd_(console_fd),
      prefix_(std::move(prefix)),
      file_path_(file_path),
      filtered_(std::move(filtered)) {
  if (!file_path.empty()) {
    file_fd_ = ::open(file_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
}

OutputSink::~OutputSink() {
  finish();
  if (file_fd_ >= 0) ::close(file_fd_);
}

void OutputSink::write(const char* data, std::size_t size) {
  if (file_fd_ >= 0 && size > 0) {
    write_file(data, size);
    file_at_line_start_ = data[size - 1] == '\n';
  }
  if (console_fd_ < 0) return;
  // Complete lines go out now, prefixed, in one write; the tail waits for its newline.
  std::string out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] != '\n') continue;
    out += prefix_;
    const std::size_t line_start = out.size();
    out += partial_;
    out.append(data + start, i + 1 - start);
    if (filtered_) filtered_->offer(prefix_, std::string_view(out).substr(line_start));
    partial_.clear();
    start = i + 1;
  }
  partial_.append(data + start, size - start);
  if (!out.empty()) write_all(console_fd_, out.data(), out.size());
}

void OutputSink::write_note(const std::string& text) {
  std::string body = text;
  if (!body.empty() && body.back() != '\n') body += '\n';
  if (file_fd_ >= 0) {
    if (!file_at_line_start_) write_file("\n", 1);
    write_file(body.data(), body.size());
    file_at_line_start_ = true;
  }
  if (console_fd_ < 0) return;
  std::string out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\n') continue;
    out += prefix_;
    out.append(body, start, i + 1 - start);
    start = i + 1;
  }
  write_all(console_fd_, out.data(), out.size());
}

void OutputSink::write_file(const char* data, std::size_t size) {
  if (file_fd_ < 0 || write_all(file_fd_, data, size)) return;
  const int error = errno;
  ::close(file_fd_);
  file_fd_ = -1;
  if (on_file_error_) on_file_error_(file_path_, error);
}

void OutputSink::finish() {
  if (console_fd_ < 0 || partial_.empty()) return;
  if (filtered_) filtered_->offer(prefix_, partial_);
  std::string out = prefix_ + partial_ + "\n";
  partial_.clear();
  write_all(console_fd_, out.data(), out.size());
}

}  // namespace ctrun::launcher
