// The two stores as the benchmark drives them: one blocking client per process, set and get of
// byte strings. Errors throw (a benchmark that loses an answer must not report a number).
#pragma once

#include <memory>
#include <string>

namespace store_bench {

class StoreClient {
 public:
  virtual ~StoreClient() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists, as both stores' get does.
  virtual std::string get(const std::string& key) = 0;
  // After the timed loop: throws if anything the loop sent failed unseen.
  virtual void finish() {}
};

// ctrund, through ctrun::rendezvous::Client (ctrun_client.cc); with `post_sets`, sets go
// through Client::post_set (one round trip per set+get pair, as TCPStore's one-way set).
std::unique_ptr<StoreClient> connect_ctrun(int port, bool post_sets);

// ctrund through a minimal blocking-socket client (raw_client.cc): a diagnostic that shows
// how much of the per-op cost is the client library's.
std::unique_ptr<StoreClient> connect_ctrun_raw(int port);

// PyTorch's c10d::TCPStore (tcpstore.cc, the only file that includes LibTorch).
std::unique_ptr<StoreClient> connect_tcpstore(int port);
// Runs a TCPStore server on an ephemeral port, writes the port to `port_file`, and serves
// until SIGTERM or SIGINT. Returns the exit code. From torch 2.4 on the server is the libuv one
// (torch's default since then), asked for by name.
int run_tcpstore_server(const std::string& port_file);

// The LibTorch this was built against, and how its TCPStore server talks.
struct TorchServerInfo {
  std::string version;          // "1.13", "2.11"
  bool validated_wire = false;  // torch 2.5+: VALIDATE and PING first, 2.2+'s numbering
  bool libuv = false;           // torch 2.4+: the libuv server
  bool supported = true;        // 2.1 to 2.4 speak numberings the load generator does not play
};
TorchServerInfo torch_server_info();

}  // namespace store_bench
