#include <boost/asio.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include "ctrun/rendezvous/client.h"
#include "launcher/agent/hosted_rendezvous.h"
#include "servers.h"

namespace bootstrap_bench {

namespace rdzv = ctrun::rendezvous;

int run_ctrun_server(const std::string& port_file, int round_ranks) {
  boost::asio::io_context io;
  // What an agent that hosts the rendezvous serves, with its defaults (no --rdzv_conf).
  rdzv::ServerOptions options = ctrun::launcher::hosted_rendezvous_options(
      ctrun::launcher::RendezvousConf{}, "127.0.0.1", 0, std::nullopt, "bootstrap");
  options.service.log = [](const std::string& line) {
    std::cerr << "ctrun server: " << line << "\n";
  };
  auto server = rdzv::Server::create(io, options);
  if (!server) {
    std::cerr << "ctrun server: " << server.error().message << "\n";
    return 1;
  }
  server.value()->start();
  const std::uint16_t port = server.value()->port();

  // The job's round: nodes of up to 4096 workers each (a node's most) join as the agents of a
  // job that size would, and keep alive; the port file is written once the round has formed.
  constexpr int kMostPerNode = 4096;
  const int nodes = (round_ranks + kMostPerNode - 1) / kMostPerNode;  // 0: no round, no file
  if (nodes == 0) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::atomic<bool> stopping{false};
  std::atomic<int> formed{0};
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<std::thread> node_threads;
  for (int n = 0; n < nodes; ++n) {
    const int workers = std::min(kMostPerNode, round_ranks - n * kMostPerNode);
    node_threads.emplace_back([&, n, workers] {
      rdzv::ClientOptions co;
      co.host = "127.0.0.1";
      co.port = port;
      co.job = "bootstrap";
      auto client = rdzv::Client::connect(co);
      if (!client) {
        std::cerr << "ctrun server: node " << n << ": " << client.error().message << "\n";
        return;
      }
      auto joined = client.value()->call({{"op", "join"},
                                          {"node", "node" + std::to_string(n)},
                                          {"host", "127.0.0.1"},
                                          {"master_port", port},
                                          {"min_nodes", nodes},
                                          {"max_nodes", nodes},
                                          {"local_world_size", workers}},
                                         std::chrono::seconds(60));
      if (!joined) {
        std::cerr << "ctrun server: join: " << joined.error().message << "\n";
        return;
      }
      if (++formed == nodes) {
        const std::string tmp = port_file + ".tmp";
        std::ofstream(tmp) << port << "\n";
        std::rename(tmp.c_str(), port_file.c_str());
      }
      std::unique_lock lock(mutex);
      while (!stopping) {
        wake.wait_for(lock, std::chrono::seconds(2));
        if (!stopping) (void)client.value()->call({{"op", "keep_alive"}}, std::chrono::seconds(5));
      }
    });
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (ec) return;
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    server.value()->stop();
    io.stop();
  });
  std::signal(SIGPIPE, SIG_IGN);
  io.run();
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  for (auto& t : node_threads) t.join();
  return 0;
}

}  // namespace bootstrap_bench
