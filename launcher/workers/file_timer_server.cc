#include "launcher/workers/file_timer_server.h"

#include <boost/asio.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "launcher/workers/file_timers.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

constexpr auto kCheckInterval = std::chrono::milliseconds(100);  // torch's max_interval
// A request is at most PIPE_BUF bytes; a line longer than this is no request at all.
constexpr std::size_t kMaxLineBytes = 64 * 1024;
// Bounds a flood of distinct scopes from a runaway worker.
constexpr std::size_t kMaxTimers = 65536;

}  // namespace

std::string default_file_timer_path(const std::string& uuid) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp && *tmp ? tmp : "/tmp";
  return dir + "/watchdog_timer_" + uuid;
}

class FileTimerServer::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::io_context& io, std::string path, Hooks hooks)
      : path_(std::move(path)), hooks_(std::move(hooks)), pipe_(io), tick_(io) {
    if (!hooks_.now) {
      hooks_.now = [] {
        return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
            .count();
      };
    }
  }

  ~Impl() {
    if (writer_ >= 0) ::close(writer_);
    std::error_code ec;
    if (made_) std::filesystem::remove(path_, ec);
  }

  rdzv::Status open() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    if (::mkfifo(path_.c_str(), 0600) != 0) {
      return rdzv::Error{
          rdzv::ErrorCode::kInternal,
          "TORCHELASTIC_TIMER_FILE: cannot make the pipe " + path_ + ": " + std::strerror(errno)};
    }
    made_ = true;
    const int reader = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    // The agent holds a writer of its own, so that the pipe never reads as ended between
    // workers' writes (each client opens, writes one line and closes).
    writer_ = reader < 0 ? -1 : ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (reader < 0 || writer_ < 0) {
      const int error = errno;
      if (reader >= 0) ::close(reader);
      return rdzv::Error{
          rdzv::ErrorCode::kInternal,
          "TORCHELASTIC_TIMER_FILE: cannot open the pipe " + path_ + ": " + std::strerror(error)};
    }
    pipe_.assign(reader);
    return rdzv::ok_status();
  }

  void start() {
    read();
    arm_tick();
  }

  void read() {
    std::weak_ptr<Impl> weak = shared_from_this();
    pipe_.async_wait(asio::posix::stream_descriptor::wait_read,
                     [weak](const boost::system::error_code& ec) {
                       auto self = weak.lock();
                       if (!self || ec) return;
                       self->drain();
                       self->read();
                     });
  }

  void drain() {
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(pipe_.native_handle(), buf, sizeof buf);
      if (n <= 0) break;  // EAGAIN: all read (never 0: the agent's writer is open)
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] == '\n') {
          if (!overlong_) take(pending_);
          pending_.clear();
          overlong_ = false;
        } else if (pending_.size() < kMaxLineBytes) {
          pending_.push_back(buf[i]);
        } else if (!overlong_) {
          overlong_ = true;
          complain("file timer: a request line over " + std::to_string(kMaxLineBytes) +
                   " bytes on " + path_ + ": ignored");
        }
      }
    }
  }

  void take(const std::string& line) {
    if (line.empty()) return;
    auto request = parse_file_timer_request(line);
    if (!request) {
      complain(request.error().message + " on " + path_ + ": ignored: " + line.substr(0, 200));
      return;
    }
    if (request.value().expiration_time >= 0 && timers_.size() >= kMaxTimers) {
      complain("file timer: " + std::to_string(kMaxTimers) + " timers already set on " + path_ +
               ": the request of pid " + std::to_string(request.value().pid) + " is ignored");
      return;
    }
    timers_.apply(request.value());
  }

  // Bad requests are said at most once a second, with the count of those not said.
  void complain(const std::string& line) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_complaint_ < std::chrono::seconds(1)) {
      ++unsaid_;
      return;
    }
    last_complaint_ = now;
    std::string text = line;
    if (unsaid_ > 0) text += " (and " + std::to_string(unsaid_) + " more not shown)";
    unsaid_ = 0;
    hooks_.say(text);
  }

  void arm_tick() {
    std::weak_ptr<Impl> weak = shared_from_this();
    tick_.expires_after(kCheckInterval);
    tick_.async_wait([weak](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec) return;
      self->check();
      self->arm_tick();
    });
  }

  void check() {
    // Timers of processes that are gone can never be served (torch's server drops them too).
    for (int pid : timers_.pids()) {
      if (::kill(pid, 0) != 0 && errno == ESRCH) timers_.forget(pid);
    }
    for (const FileTimerExpiry& expiry : timers_.take_expired(hooks_.now())) reap(expiry);
  }

  void reap(const FileTimerExpiry& expiry) {
    const std::string who = "pid " + std::to_string(expiry.pid);
    const pid_t group = ::getpgid(expiry.pid);
    if (group < 0) return;  // gone since
    const std::optional<int> local_rank = hooks_.worker_of_group(group);
    if (!local_rank) {
      hooks_.say("file timer: " + who + "'s timers " + scope_list(expiry.scopes) +
                 " expired, but it is not a process of this agent's workers: not signalled");
      return;
    }
    if (expiry.signal <= 0) {
      hooks_.say("file timer: " + who + "'s timers " + scope_list(expiry.scopes) +
                 " expired with no signal to send: left alone");
      return;
    }
    if (::kill(expiry.pid, expiry.signal) != 0 && errno != ESRCH) {
      hooks_.say("file timer: cannot signal " + who + ": " + std::strerror(errno));
      return;
    }
    hooks_.reaped(FileTimerReap{.local_rank = *local_rank,
                                .pid = expiry.pid,
                                .scopes = expiry.scopes,
                                .signal = expiry.signal,
                                .signal_scope = expiry.signal_scope});
  }

  std::string path_;
  Hooks hooks_;
  asio::posix::stream_descriptor pipe_;
  asio::steady_timer tick_;
  int writer_ = -1;
  bool made_ = false;
  FileTimers timers_;
  std::string pending_;
  bool overlong_ = false;
  std::chrono::steady_clock::time_point last_complaint_{};
  std::size_t unsaid_ = 0;
};

rdzv::Result<std::unique_ptr<FileTimerServer>> FileTimerServer::create(asio::io_context& io,
                                                                       const std::string& path,
                                                                       Hooks hooks) {
  auto impl = std::make_shared<Impl>(io, path, std::move(hooks));
  if (auto s = impl->open(); !s) return s.error();
  impl->start();
  return std::unique_ptr<FileTimerServer>(new FileTimerServer(std::move(impl)));
}

FileTimerServer::FileTimerServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
FileTimerServer::~FileTimerServer() {
  boost::system::error_code ignored;
  impl_->tick_.cancel();
  impl_->pipe_.close(ignored);
}
const std::string& FileTimerServer::path() const { return impl_->path_; }
void FileTimerServer::clear() { impl_->timers_.clear(); }

}  // namespace ctrun::launcher
