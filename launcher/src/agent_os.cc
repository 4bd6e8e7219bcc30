#include "agent_os.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ctrun/rendezvous/json.h"
#include "rendezvous/protocol/auth.h"

extern char** environ;

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

std::string random_uuid() {
  std::string hex = rdzv::random_hex(16);
  hex[12] = '4';
  hex[16] = "89ab"[hex[16] % 4];
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
         hex.substr(16, 4) + "-" + hex.substr(20);
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

std::optional<std::int64_t> reported_step(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[32];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  text[n] = '\0';
  char* end = nullptr;
  const long long step = std::strtoll(text, &end, 10);
  if (end == text) return std::nullopt;
  return static_cast<std::int64_t>(step);
}

std::int64_t modification_stamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
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

}  // namespace ctrun::launcher
