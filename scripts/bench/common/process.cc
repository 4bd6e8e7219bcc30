#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace bench {
namespace {

// Live children, for the signal handler (which may only call async-signal-safe functions).
constexpr std::size_t kMaxChildren = 256;
std::array<std::atomic<pid_t>, kMaxChildren> g_children{};

void register_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}

void unregister_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

extern "C" void on_fatal_signal(int) {
  for (auto& slot : g_children) {
    const pid_t pid = slot.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  _exit(130);
}

void check(int rc, const char* what) {
  if (rc != 0) throw std::runtime_error(std::string(what) + ": " + std::strerror(rc));
}

}  // namespace

Pipe Pipe::create() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  return Pipe{fds[0], fds[1]};
}

void Pipe::close_read() {
  if (read_fd >= 0) ::close(read_fd);
  read_fd = -1;
}

void Pipe::close_write() {
  if (write_fd >= 0) ::close(write_fd);
  write_fd = -1;
}

Pipe::Pipe(Pipe&& other) noexcept { *this = std::move(other); }

Pipe& Pipe::operator=(Pipe&& other) noexcept {
  if (this != &other) {
    close_read();
    close_write();
    read_fd = std::exchange(other.read_fd, -1);
    write_fd = std::exchange(other.write_fd, -1);
  }
  return *this;
}

Pipe::~Pipe() {
  close_read();
  close_write();
}

Child Child::spawn(const Options& options) {
  posix_spawn_file_actions_t actions;
  check(posix_spawn_file_actions_init(&actions), "posix_spawn_file_actions_init");
  Pipe out;
  if (options.stdin_fd >= 0) {
    check(posix_spawn_file_actions_adddup2(&actions, options.stdin_fd, 0), "adddup2 stdin");
  } else {
    check(posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0), "addopen stdin");
  }
  if (options.capture_stdout) {
    out = Pipe::create();
    check(posix_spawn_file_actions_adddup2(&actions, out.write_fd, 1), "adddup2 stdout");
  }
  if (!options.stderr_path.empty()) {
    check(posix_spawn_file_actions_addopen(&actions, 2, options.stderr_path.c_str(),
                                           O_WRONLY | O_CREAT | O_APPEND, 0644),
          "addopen stderr");
  }
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  check(rc, ("spawn " + options.argv[0]).c_str());
  register_child(pid);
  Child child;
  child.pid_ = pid;
  if (options.capture_stdout) {
    out.close_write();
    child.stdout_fd_ = out.read_fd;
    out.read_fd = -1;
  }
  return child;
}

Child::Child(Child&& other) noexcept { *this = std::move(other); }

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    release();
    pid_ = std::exchange(other.pid_, -1);
    stdout_fd_ = std::exchange(other.stdout_fd_, -1);
    buffered_ = std::move(other.buffered_);
  }
  return *this;
}

Child::~Child() { release(); }

void Child::release() {
  if (pid_ > 0) stop(std::chrono::milliseconds(0));
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  stdout_fd_ = -1;
}

std::optional<std::string> Child::read_line(Clock::time_point deadline) {
  while (true) {
    if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (stdout_fd_ < 0) return std::nullopt;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<long>(left.count() + 1, 1000)));
    if (ready < 0 && errno != EINTR) return std::nullopt;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(stdout_fd_);
      stdout_fd_ = -1;
      if (buffered_.empty()) return std::nullopt;
      return std::exchange(buffered_, std::string());
    }
    buffered_.append(buf, static_cast<std::size_t>(n));
  }
}

std::optional<int> Child::wait_until(Clock::time_point deadline) {
  if (pid_ <= 0) return std::nullopt;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      unregister_child(pid_);
      pid_ = -1;
      return status;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int Child::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return 0;
  if (grace.count() > 0) {
    kill(pid_, SIGTERM);
    if (auto s = wait_until(Clock::now() + grace)) return *s;
  }
  kill(pid_, SIGKILL);
  return wait_until(Clock::now() + std::chrono::seconds(10)).value_or(-1);
}

std::optional<int> wait_for_port_file(const std::string& path, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() == '\n') {
      try {
        const int port = std::stoi(text);
        if (port > 0 && port < 65536) return port;
      } catch (const std::exception&) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

long read_vm_hwm_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

double read_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the parenthesised command name (which may hold spaces): utime is the 12th
  // field after it, stime the 13th.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i == 12) utime = std::atol(field.c_str());
    if (i == 13) stime = std::atol(field.c_str());
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

long raise_nofile_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return -1;
  // Root may go past the hard limit, to what the packaged ctrund unit sets (LimitNOFILE).
  constexpr rlim_t kPackaged = 1048576;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < kPackaged) {
    rlimit root = {kPackaged, kPackaged};
    if (setrlimit(RLIMIT_NOFILE, &root) == 0) return static_cast<long>(kPackaged);
  }
  lim.rlim_cur = lim.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return -1;
  return static_cast<long>(lim.rlim_cur);
}

std::string make_temp_dir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/" + prefix + "XXXXXX";
  if (!mkdtemp(templ.data()))
    throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
  return templ;
}

void remove_tree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

void die_with_parent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }

void install_cleanup_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace bench
