// A worker that plays a whole job's ranks against its agent's store: the bootstrap traffic of
// `--ranks` simulated ranks (tests/common/bootstrap_load.h) to MASTER_ADDR:MASTER_PORT, every
// connection from this one process's address. Exit 0 when every rank got through the barrier;
// 1 with the first failure on stderr; 3 when this machine's open-file limit cannot hold the
// connections (the test skips).
#include <netdb.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bootstrap_load.h"
#include "rendezvous/base/open_files.h"

namespace {

std::string ipv4_of(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) return {};
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof text);
  freeaddrinfo(found);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ts = ctrun::rendezvous::tcpstore;
  bootstrap_load::LoadOptions o;
  o.dialect = ts::Dialect::kValidated;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--ranks") {
      o.ranks = std::atoi(value.c_str());
    } else if (flag == "--dialect") {
      o.dialect = value == "legacy" ? ts::Dialect::kLegacy : ts::Dialect::kValidated;
    } else {
      std::fprintf(stderr, "store_load_worker: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!addr || !port || o.ranks < 1) {
    std::fprintf(stderr, "store_load_worker: needs MASTER_ADDR, MASTER_PORT and --ranks N\n");
    return 2;
  }
  o.host = ipv4_of(addr);
  o.port = std::atoi(port);
  const auto files = ctrun::rendezvous::raise_open_file_limit();
  if (files.soft < static_cast<std::uint64_t>(o.ranks) + 64) {
    std::fprintf(stderr,
                 "store_load_worker: %d connections need more than the open-file limit %llu\n",
                 o.ranks, static_cast<unsigned long long>(files.soft));
    return 3;
  }
  o.timeout = std::chrono::seconds(60);
  const auto r = bootstrap_load::run_bootstrap(o);
  if (!r.ok) {
    std::fprintf(stderr, "store_load_worker: %s\n", r.error.c_str());
    return 1;
  }
  std::printf("store_load_worker: %d ranks through the barrier in %.1f ms (%d connect retries)\n",
              o.ranks, r.wall_s * 1e3, r.connect_retries);
  return 0;
}
