// Reads the worker environment, trains one DDP step alone (world size 1), then starts an
// embedded rendezvous server and talks to it through the installed client library.
#include <torch/torch.h>

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <thread>

#include "ctrun/rendezvous/client.h"
#include "ctrun/rendezvous/server.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"

int main() {
  namespace rdzv = ctrun::rendezvous;
  // No launcher here: the worker runtime sees a single process.
  auto env = ctrun::worker::read_worker_env(ctrun::worker::process_environment());
  if (!env || env.value().world_size != 1) return 1;
  auto group = ctrun::worker::init_process_group(env.value());
  auto model = std::make_shared<torch::nn::LinearImpl>(4, 2);
  ctrun::worker::DistributedDataParallel ddp(model, *group);
  model->forward(torch::ones({3, 4})).sum().backward();
  if (!model->weight.grad().defined()) return 1;
  boost::asio::io_context io;
  rdzv::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  auto server = rdzv::Server::create(io, options);
  if (!server) return 1;
  server.value()->start();
  std::thread loop([&] { io.run_for(std::chrono::seconds(10)); });
  rdzv::ClientOptions client_options;
  client_options.port = server.value()->port();
  auto client = rdzv::Client::connect(client_options);
  int rc = 1;
  if (client && client.value()->set("k", "v") && client.value()->get("k").value() == "v") rc = 0;
  client = rdzv::Error{rdzv::ErrorCode::kConnection, "done"};
  io.stop();
  loop.join();
  std::puts(rc == 0 ? "consumer: ok" : "consumer: failed");
  return rc;
}
