// The LibTorch side of store_bench: the only translation unit that includes torch headers.
#include <signal.h>

#include <cstdio>
#include <fstream>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "store_client.h"

// torch 2.4 made the libuv server TCPStore's default and named the choice in its options.
#define CTRUN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace store_bench {
namespace {

constexpr std::chrono::seconds kTimeout{30};

class TorchStoreClient final : public StoreClient {
 public:
  explicit TorchStoreClient(int port) : store_("127.0.0.1", options(port)) {}

  void set(const std::string& key, const std::string& value) override {
    store_.set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }

  std::string get(const std::string& key) override {
    const std::vector<std::uint8_t> v = store_.get(key);
    return std::string(v.begin(), v.end());
  }

 private:
  static c10d::TCPStoreOptions options(int port) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = kTimeout;
    return o;
  }

  c10d::TCPStore store_;
};

}  // namespace

std::unique_ptr<StoreClient> connect_tcpstore(int port) {
  return std::make_unique<TorchStoreClient>(port);
}

int run_tcpstore_server(const std::string& port_file) {
  // Block the stop signals before TCPStore starts its threads, so they inherit the mask and
  // sigwait() below is the only receiver.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  c10d::TCPStoreOptions o;
  o.port = 0;  // ephemeral; TCPStore binds every interface whatever host it is given
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = kTimeout;
#if CTRUN_TORCH_AT_LEAST(2, 4)
  o.useLibUV = true;
#endif
  c10d::TCPStore server("127.0.0.1", o);
  {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << server.getPort() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  int signo = 0;
  sigwait(&stop, &signo);
  return 0;
}

TorchServerInfo torch_server_info() {
  TorchServerInfo info;
  info.version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  info.validated_wire = CTRUN_TORCH_AT_LEAST(2, 5);
  info.libuv = CTRUN_TORCH_AT_LEAST(2, 4);
  info.supported = !CTRUN_TORCH_AT_LEAST(2, 1) || info.validated_wire;
  return info;
}

}  // namespace store_bench
