#include "ctrun/worker/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace ctrun::worker {

bool HeartbeatFile::beat(Clock::time_point now) {
  if (beaten_ && now - last_ < min_interval_) return false;
  beaten_ = true;
  last_ = now;
  // The agent created the file; a beat only moves its time, so a beat never creates files in a
  // directory the agent has already removed.
  return utimensat(AT_FDCWD, path_.c_str(), nullptr, 0) == 0;
}

bool HeartbeatFile::write_step(std::int64_t step, std::optional<std::int64_t> waited_ns) {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // Written over the last record at a fixed width (as ctrun_worker.py writes it), never
  // truncated: ext4 flushes a file truncated and written again when it is closed.
  std::string text = std::to_string(step) + (waited_ns ? " " + std::to_string(*waited_ns) : "");
  text.resize(std::max<std::size_t>(text.size(), kRecordWidth), ' ');
  text += "\n";
  const bool ok = ::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

namespace {

// The process's heartbeat file (CTRUN_HEARTBEAT_FILE), or null; used under its mutex.
HeartbeatFile* process_file(std::unique_lock<std::mutex>& lock) {
  static std::mutex mutex;
  static const std::unique_ptr<HeartbeatFile> file = [] {
    const char* path = std::getenv("CTRUN_HEARTBEAT_FILE");
    return path && *path ? std::make_unique<HeartbeatFile>(path) : nullptr;
  }();
  lock = std::unique_lock(mutex);
  return file.get();
}

struct PlannedFault {
  bool cuda_error = false;
  std::string message;
};

// The fault the agent wrote into CTRUN_FAULT_FILE, if it has: its kind on the first line
// ("exception" or "cuda_error"), its message on the second.
std::optional<PlannedFault> injected_fault() {
  static const std::string path = [] {
    const char* p = std::getenv("CTRUN_FAULT_FILE");
    return std::string(p ? p : "");
  }();
  if (path.empty()) return std::nullopt;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text(512, '\0');
  const ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  PlannedFault fault;
  const auto newline = text.find('\n');
  const std::string kind = text.substr(0, newline);
  if (kind != "exception" && kind != "cuda_error") {
    fault.message = text;  // a message alone, as agents before the CUDA error kind wrote it
  } else {
    fault.cuda_error = kind == "cuda_error";
    fault.message = newline == std::string::npos ? "" : text.substr(newline + 1);
  }
  if (fault.message.empty()) {
    fault.message = fault.cuda_error ? "ctrun: injected cuda_error" : "ctrun: injected exception";
  }
  return fault;
}

// The process's waits in collectives, in nanoseconds; -1 before the first.
std::atomic<std::int64_t> collective_wait_ns{-1};

std::mutex cuda_error_mutex;
CudaErrorMaker cuda_error_maker;

}  // namespace

void heartbeat() {
  std::unique_lock<std::mutex> lock;
  if (HeartbeatFile* file = process_file(lock)) file->beat(HeartbeatFile::Clock::now());
}

void add_collective_wait(std::chrono::nanoseconds waited) {
  const std::int64_t ns = std::max<std::int64_t>(waited.count(), 0);
  std::int64_t seen = collective_wait_ns.load(std::memory_order_relaxed);
  while (!collective_wait_ns.compare_exchange_weak(seen, std::max<std::int64_t>(seen, 0) + ns,
                                                   std::memory_order_relaxed)) {
  }
}

void set_cuda_error_maker(CudaErrorMaker maker) {
  std::lock_guard lock(cuda_error_mutex);
  cuda_error_maker = std::move(maker);
}

void report_step(std::int64_t step) {
  if (auto fault = injected_fault()) {
    if (fault->cuda_error) {
      CudaErrorMaker maker;
      {
        std::lock_guard lock(cuda_error_mutex);
        maker = cuda_error_maker;
      }
      if (!maker) {
        throw InjectedFault(fault->message +
                            ": no CUDA device in this worker (its process group is not "
                            "libctrun_worker's NCCL one); raised as an exception instead");
      }
      maker(fault->message);  // throws LibTorch's CUDA error
    }
    throw InjectedFault(fault->message);
  }
  std::unique_lock<std::mutex> lock;
  if (HeartbeatFile* file = process_file(lock)) {
    const std::int64_t waited = collective_wait_ns.load(std::memory_order_relaxed);
    file->write_step(step, waited >= 0 ? std::optional<std::int64_t>(waited) : std::nullopt);
  }
}

}  // namespace ctrun::worker
