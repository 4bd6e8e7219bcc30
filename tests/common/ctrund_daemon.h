// Test helpers: a ctrund child process on an ephemeral port, killed by PID when the test ends;
// connections from another loopback address; a round of two joined on two threads (the flood
// tests). Needs CTRUND_PATH defined by the test target.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ctrun/rendezvous/client.h"
#include "process.h"

namespace ctrun::testing {

// A ctrund on 127.0.0.1 and an ephemeral port (or `port`), killed by PID when the test ends.
class CtrundDaemon {
 public:
  explicit CtrundDaemon(std::vector<std::string> extra = {}, std::string host = "127.0.0.1",
                        std::uint16_t port = 0)
      : port_file_(temp_path("port_" + std::to_string(counter_++))), log_(port_file_ + ".log") {
    std::remove(port_file_.c_str());
    std::vector<std::string> argv = {CTRUND_PATH,          "--host",      host,      "--port",
                                     std::to_string(port), "--port_file", port_file_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process_ = std::make_unique<ChildProcess>(argv, log_);
    auto bound = wait_for_file(port_file_, std::chrono::seconds(10));
    if (!bound) throw std::runtime_error("ctrund did not start: " + read_file(log_));
    port_ = static_cast<std::uint16_t>(std::stoi(*bound));
  }
  ~CtrundDaemon() {
    process_.reset();
    std::remove(port_file_.c_str());
    std::remove(log_.c_str());
  }
  std::uint16_t port() const { return port_; }
  ChildProcess& process() { return *process_; }
  std::string log() const { return read_file(log_); }
  rendezvous::ClientOptions options(const std::string& job = "job") const {
    rendezvous::ClientOptions o;
    o.host = "127.0.0.1";
    o.port = port_;
    o.job = job;
    o.connect_timeout = std::chrono::seconds(5);
    return o;
  }

 private:
  static inline int counter_ = 0;
  std::string port_file_;
  std::string log_;
  std::unique_ptr<ChildProcess> process_;
  std::uint16_t port_ = 0;
};

// A TCP connection to 127.0.0.1:`port` from the address `from` (e.g. "127.0.0.2"), or -1.
inline int connect_from(const char* from, std::uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, from, &local.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Two nodes join one round of two, each through its own blocking Client (with `options`) on a
// thread of its own, each join waiting at most 5 s. For each node: "" when it got its place in
// a round of 2, else why not. (Plain strings out of the threads: g++ 12 warns falsely on a
// Result<Json> assigned there.)
inline std::vector<std::string> join_round_of_two(const rendezvous::ClientOptions& options) {
  std::vector<std::string> errors(2, "did not run");
  std::vector<std::thread> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.emplace_back([&, i] {
      auto client = rendezvous::Client::connect(options);
      if (!client) {
        errors[i] = client.error().message;
        return;
      }
      auto answer = client.value()->call(rendezvous::Json{{"op", "join"},
                                                          {"node", "n" + std::to_string(i)},
                                                          {"host", "127.0.0.1"},
                                                          {"local_world_size", 1},
                                                          {"min_nodes", 2},
                                                          {"max_nodes", 2}},
                                         std::chrono::seconds(5));
      if (!answer) {
        errors[i] = answer.error().message;
        return;
      }
      const auto world = answer.value().value("group_world_size", 0);
      errors[i] = world == 2 ? "" : "a round of " + std::to_string(world);
    });
  }
  for (auto& t : nodes) t.join();
  return errors;
}

}  // namespace ctrun::testing
