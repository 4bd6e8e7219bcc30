#include "launcher/agent/agent_os.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/capability.h>
#include <netdb.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ctrun/rendezvous/json.h"
#include "rendezvous/base/random.h"

extern char** environ;

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

std::string python_executable() {
  const char* python = std::getenv("PYTHON_EXEC");
  return python && *python ? python : "python3";
}

std::string random_uuid() {
  std::string hex = rdzv::random_hex(16);
  hex[12] = '4';
  hex[16] = "89ab"[hex[16] % 4];
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
         hex.substr(16, 4) + "-" + hex.substr(20);
}

std::string fully_qualified_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  const std::string host = name;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return host;
  // gethostbyaddr_r, as Python's gethostbyaddr: the entry's name and aliases.
  hostent entry{};
  hostent* result = nullptr;
  std::vector<char> buf(16384);
  int error = 0;
  const void* addr = nullptr;
  socklen_t len = 0;
  int family = found->ai_family;
  if (family == AF_INET) {
    addr = &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
    len = sizeof(in_addr);
  } else if (family == AF_INET6) {
    addr = &reinterpret_cast<const sockaddr_in6*>(found->ai_addr)->sin6_addr;
    len = sizeof(in6_addr);
  }
  std::string fqdn = host;
  if (addr != nullptr &&
      gethostbyaddr_r(addr, len, family, &entry, buf.data(), buf.size(), &result, &error) == 0 &&
      result != nullptr && result->h_name != nullptr) {
    std::vector<std::string> names = {result->h_name};
    for (char** alias = result->h_aliases; alias && *alias; ++alias) names.emplace_back(*alias);
    fqdn = names.front();
    for (const auto& n : names) {
      if (n.find('.') != std::string::npos) {
        fqdn = n;
        break;
      }
    }
  }
  freeaddrinfo(found);
  return fqdn;
}

bool is_local_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  std::vector<std::string> wanted;
  for (addrinfo* a = found; a; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) ==
        0) {
      wanted.push_back(text);
    }
    if (a->ai_family == AF_INET &&
        (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127) {
      freeaddrinfo(found);
      return true;
    }
  }
  freeaddrinfo(found);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool local = false;
  for (ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) {
      continue;
    }
    char text[INET6_ADDRSTRLEN] = {};
    const socklen_t len =
        i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(i->ifa_addr, len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    for (const auto& w : wanted) local = local || w == text;
  }
  freeifaddrs(ifs);
  return local;
}

int free_port(asio::io_context& io, const std::string& host) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) addr = asio::ip::address_v4::any();
  asio::ip::tcp::acceptor probe(io);
  probe.open(addr.is_v6() ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), ec);
  probe.bind({addr, 0}, ec);
  if (ec) return 0;
  return probe.local_endpoint(ec).port();
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

bool write_text_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return false;
  }
  return std::rename(temporary.c_str(), path.c_str()) == 0;
}

void write_error_file_if_absent(const std::string& path, const std::string& message) {
  if (std::filesystem::exists(path)) return;
  const std::string text = rdzv::Json{{"message", message}}.dump();
  if (std::FILE* f = std::fopen(path.c_str(), "w")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  return env;
}

ToolRun run_tool(const std::vector<std::string>& argv) {
  ToolRun run;
  if (argv.empty()) return run;
  std::string program = argv[0];
  if (program.find('/') == std::string::npos) {
    // Network tools live in sbin, which a user's PATH may lack.
    std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
    path += ":/usr/sbin:/sbin";
    std::istringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      if (!dir.empty() && ::access((dir + "/" + argv[0]).c_str(), X_OK) == 0) {
        program = dir + "/" + argv[0];
        break;
      }
    }
  }
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return run;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (spawned != 0) {
    ::close(out[0]);
    run.output = argv[0] + ": " + std::strerror(spawned);
    return run;
  }
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    run.output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  while (!run.output.empty() && run.output.back() == '\n') run.output.pop_back();
  return run;
}

bool can_admin_network() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return ::geteuid() == 0;
  return (data[CAP_NET_ADMIN / 32].effective & (1u << (CAP_NET_ADMIN % 32))) != 0;
}

}  // namespace ctrun::launcher
