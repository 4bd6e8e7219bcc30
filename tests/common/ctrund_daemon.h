// Test helper: a ctrund child process on an ephemeral port, killed by PID when the test ends.
// Needs CTRUND_PATH defined by the test target.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
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

}  // namespace ctrun::testing
