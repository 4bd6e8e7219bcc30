// Reads the worker environment, trains one DDP step alone (world size 1), then talks to the
// installed ctrund (started by run.sh on the port given as argv[1]) through the installed
// client library: the blocking Client, and the store a worker gets from connect_store.
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ctrun/rendezvous/client.h"
#include "ctrun/rendezvous/store_client.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"

int main(int argc, char** argv) {
  namespace rdzv = ctrun::rendezvous;
  if (argc != 2) return 2;
  // No launcher here: the worker runtime sees a single process.
  auto env = ctrun::worker::read_worker_env(ctrun::worker::process_environment());
  if (!env || env.value().world_size != 1) return 1;
  auto group = ctrun::worker::init_process_group(env.value());
  auto model = std::make_shared<torch::nn::LinearImpl>(4, 2);
  ctrun::worker::DistributedDataParallel ddp(model, *group);
  model->forward(torch::ones({3, 4})).sum().backward();
  if (!model->weight.grad().defined()) return 1;

  const int port = std::atoi(argv[1]);
  rdzv::ClientOptions client_options;
  client_options.port = static_cast<std::uint16_t>(port);
  client_options.job = "consumer";
  client_options.connect_timeout = std::chrono::seconds(10);
  auto client = rdzv::Client::connect(client_options);
  if (!client || !client.value()->set("k", "v")) return 1;

  rdzv::StoreAddress address;
  address.host = "127.0.0.1";
  address.port = port;
  auto store = rdzv::connect_store(address, "consumer", std::chrono::seconds(10));
  if (!store) return 1;
  auto value = store.value()->get("k");
  auto added = store.value()->add("n", 2);
  const bool ok = value && value.value() == "v" && added && added.value() == 2;
  std::puts(ok ? "consumer: ok" : "consumer: failed");
  return ok ? 0 : 1;
}
