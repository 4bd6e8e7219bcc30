#include <boost/asio.hpp>

#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "ctrun/rendezvous/client.h"
#include "hosted_rendezvous.h"
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

  // The job's round: one node of `round_ranks` workers joins, as the agents of a job that size
  // would, and keeps alive; the port file is written once the round has formed.
  std::atomic<bool> stopping{false};
  std::mutex mutex;
  std::condition_variable wake;
  std::thread node([&] {
    rdzv::ClientOptions co;
    co.host = "127.0.0.1";
    co.port = port;
    co.job = "bootstrap";
    auto client = rdzv::Client::connect(co);
    if (!client) {
      std::cerr << "ctrun server: the round's node: " << client.error().message << "\n";
      return;
    }
    auto joined = client.value()->call({{"op", "join"},
                                        {"node", "node0"},
                                        {"host", "127.0.0.1"},
                                        {"master_port", port},
                                        {"min_nodes", 1},
                                        {"max_nodes", 1},
                                        {"local_world_size", round_ranks}},
                                       std::chrono::seconds(30));
    if (!joined) {
      std::cerr << "ctrun server: join: " << joined.error().message << "\n";
      return;
    }
    {
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
  node.join();
  return 0;
}

}  // namespace bootstrap_bench
