// Test helper: ctrund's server inside the test process, on 127.0.0.1 at an ephemeral port, its
// event loop on a thread of its own for at most `run_for`. For tests that link ctrun_rendezvous
// and need a daemon's store but not a daemon process.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "catch.h"
#include "ctrun/rendezvous/store_address.h"
#include "rendezvous/daemon/server.h"

namespace ctrun::testing {

class LoopbackDaemon {
 public:
  explicit LoopbackDaemon(std::chrono::seconds run_for = std::chrono::seconds(60)) {
    rendezvous::ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = rendezvous::Server::create(io_, options);
    REQUIRE(server);
    server_ = std::move(server.value());
    server_->start();
    loop_ = std::thread([this, run_for] { io_.run_for(run_for); });
  }
  ~LoopbackDaemon() {
    io_.stop();
    loop_.join();
  }
  LoopbackDaemon(const LoopbackDaemon&) = delete;
  LoopbackDaemon& operator=(const LoopbackDaemon&) = delete;

  std::uint16_t port() const { return server_->port(); }
  // Where a worker finds the store of a job here, under `prefix`.
  rendezvous::StoreAddress store_address(const std::string& prefix = "") const {
    rendezvous::StoreAddress address;
    address.host = "127.0.0.1";
    address.port = port();
    address.prefix = prefix;
    return address;
  }

 private:
  boost::asio::io_context io_;
  std::unique_ptr<rendezvous::Server> server_;
  std::thread loop_;
};

}  // namespace ctrun::testing
