#include "consumed_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>

namespace ctrun::trainers {
namespace {

std::string unix_ms() {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
}

}  // namespace

ConsumedLog::ConsumedLog(const std::string& path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("--consumed_log: cannot open " + path);
}

ConsumedLog::~ConsumedLog() {
  if (fd_ >= 0) ::close(fd_);
}

void ConsumedLog::commit(const std::string& who, std::uint64_t epoch, std::int64_t step,
                         const std::vector<std::uint64_t>& indices) {
  if (fd_ < 0) return;
  std::string line = who + " " + std::to_string(epoch) + " " + std::to_string(step) + " " +
                     unix_ms() + " " + std::to_string(::getpid());
  for (auto i : indices) {
    // Appended in two pieces: g++ 12 at -O3 warns falsely on `" " + std::string&&` (GCC bug
    // 105651).
    line += ' ';
    line += std::to_string(i);
  }
  write(line + "\n");
}

void ConsumedLog::fault(const std::string& who, std::int64_t committed_steps) {
  if (fd_ < 0) return;
  write(who + " fault " + unix_ms() + " " + std::to_string(::getpid()) + " " +
        std::to_string(committed_steps) + "\n");
}

void ConsumedLog::write(const std::string& line) {
  if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    throw std::runtime_error("--consumed_log: write failed");
  }
}

}  // namespace ctrun::trainers
