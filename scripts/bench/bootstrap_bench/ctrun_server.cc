#include <boost/asio.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "rendezvous/daemon/server.h"
#include "servers.h"

namespace bootstrap_bench {

int run_ctrun_server(const std::string& port_file) {
  namespace rdzv = ctrun::rendezvous;
  boost::asio::io_context io;
  rdzv::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.service.worker_store_job = "bootstrap";
  options.service.max_connections = 1u << 20;
  options.service.max_connections_per_host = 1u << 20;
  options.service.log = [](const std::string& line) {
    std::cerr << "ctrun server: " << line << "\n";
  };
  auto server = rdzv::Server::create(io, options);
  if (!server) {
    std::cerr << "ctrun server: " << server.error().message << "\n";
    return 1;
  }
  server.value()->start();
  {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << server.value()->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (ec) return;
    server.value()->stop();
    io.stop();
  });
  std::signal(SIGPIPE, SIG_IGN);
  io.run();
  return 0;
}

}  // namespace bootstrap_bench
