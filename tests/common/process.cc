#include "process.h"

#include "catch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ctrun::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

void ChildProcess::signal(int signo) const {
  if (pid_ > 0 && !reaped_) ::kill(pid_, signo);
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

std::optional<std::string> wait_for_file(const std::string& path,
                                         std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string content = read_file(path);
    if (!content.empty() && content.back() == '\n') return content;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

bool wait_for_text(const std::string& path, const std::string& text,
                   std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_file(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

namespace {

std::string ask_python_fqdn() {
  const std::string out = temp_path("fqdn");
  ChildProcess python({"/usr/bin/python3", "-c", "import socket; print(socket.getfqdn(), end='')"},
                      out);
  const bool done = python.wait(std::chrono::seconds(30)) == std::optional<int>(0);
  std::string name = done ? read_file(out) : "";
  ::unlink(out.c_str());
  if (name.empty()) throw std::runtime_error("python_fqdn: python3 said nothing");
  return name;
}

}  // namespace

// Asked once per test process: the host's name does not change under it, and a Python start
// costs a few hundred milliseconds on a loaded machine.
std::string python_fqdn() {
  static const std::string name = ask_python_fqdn();
  return name;
}

SilentListener::SilentListener(bool every_interface) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(every_interface ? INADDR_ANY : INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd_, 16) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error("SilentListener: cannot listen");
  }
  port_ = ntohs(addr.sin_port);
}

SilentListener::~SilentListener() { ::close(fd_); }

namespace {

std::string find_standalone_master_addr() {
  const std::string name = python_fqdn();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name.c_str(), "0", &hints, &found) != 0) return "127.0.0.1";
  bool listens = false;
  for (addrinfo* a = found; a != nullptr && !listens; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    listens = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  freeaddrinfo(found);
  return listens ? name : "127.0.0.1";
}

}  // namespace

std::string standalone_master_addr() {
  static const std::string addr = find_standalone_master_addr();
  return addr;
}

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("free_port: socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error("free_port: bind to 127.0.0.1:0 failed");
  return ntohs(address.sin_port);
}

bool can_unshare_network() {
  ChildProcess probe({"/usr/bin/unshare", "-n", "/bin/true"}, "/dev/null");
  return probe.wait(std::chrono::seconds(10)) == std::optional<int>(0);
}

std::string temp_path(const std::string& name) {
  return "/tmp/ctrun_test_" + std::to_string(getpid()) + "_" + name;
}

void remove_tree(const std::string& path) {
  // Depth first, not following links: files before the directories that hold them.
  nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) {
        ::remove(entry);
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

ScratchDir::ScratchDir(const std::string& name) {
  static std::atomic<int> counter{0};
  dir_ = temp_path(name + "_" + std::to_string(counter++));
  remove_tree(dir_);
  std::filesystem::create_directories(dir_);
}

ScratchDir::~ScratchDir() { remove_tree(dir_); }

SystemPython::SystemPython() { ::setenv("PYTHON_EXEC", "/usr/bin/python3", 1); }
SystemPython::~SystemPython() { ::unsetenv("PYTHON_EXEC"); }

std::uint16_t start_ctrund(std::unique_ptr<ChildProcess>& daemon, const ScratchDir& dir,
                           const std::string& ctrund_path, const std::vector<std::string>& extra,
                           std::uint16_t port, const std::string& name) {
  const std::string port_file = dir.path(name + ".port");
  std::vector<std::string> argv = {ctrund_path,          "--host",      "127.0.0.1", "--port",
                                   std::to_string(port), "--port_file", port_file};
  argv.insert(argv.end(), extra.begin(), extra.end());
  daemon = std::make_unique<ChildProcess>(argv, dir.path(name + ".log"));
  auto bound = wait_for_file(port_file, std::chrono::seconds(10));
  REQUIRE(bound.has_value());
  return static_cast<std::uint16_t>(std::stoi(*bound));
}

}  // namespace ctrun::testing
