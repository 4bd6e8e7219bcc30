#include "ctrun/worker/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "daemon_store.h"
#include "gloo_group.h"
#include "nccl_group.h"

namespace ctrun::worker {
namespace {

bool is_loopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1";
}

// Where the ranks meet. Keys carry the restart count, so a restarted job never reads the
// addresses its previous attempt left behind.
c10::intrusive_ptr<c10d::Store> make_store(const WorkerEnv& env,
                                           std::chrono::milliseconds timeout) {
  const std::string attempt = "ctrun/pg/" + std::to_string(env.restart_count) + "/";
  if (env.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  if (env.store) {
    return c10::make_intrusive<DaemonStore>(*env.store, env.run_id, env.store->prefix + attempt,
                                            timeout);
  }
  // torchrun: its agent serves the TCPStore (USE_AGENT_STORE=True) or rank 0 starts one, as
  // init_process_group("env://") does.
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = !env.use_agent_store && env.rank == 0;
  options.numWorkers = env.world_size;
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    return c10::make_intrusive<c10d::PrefixStore>(attempt, tcp);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw CollectiveError("TCPStore at " + env.master_addr + ":" + std::to_string(env.master_port) +
                          ": " + what.substr(0, what.find('\n')));
  }
}

}  // namespace

Backend parse_backend(const std::string& name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  throw std::invalid_argument("backend: expected gloo or nccl, got '" + name + "'");
}

const char* backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

std::unique_ptr<ProcessGroup> init_process_group(const WorkerEnv& env,
                                                 const ProcessGroupOptions& options) {
  auto store = make_store(env, options.timeout);
  if (options.backend == Backend::kNccl) {
    return make_nccl_group(store, env.rank, env.world_size, env.local_rank, options.timeout);
  }
  // On one host (loopback master) bind loopback: no name resolution, no routing surprises.
  const std::string host = is_loopback(env.master_addr) ? "127.0.0.1" : "";
  return make_gloo_group(store, env.rank, env.world_size, host, options.timeout);
}

}  // namespace ctrun::worker
