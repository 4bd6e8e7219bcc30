#include "ctrun/worker/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include "ctrun/worker/heartbeat.h"
#include "rendezvous/base/local_address.h"
#include "worker_runtime/base/error_text.h"
#include "worker_runtime/process_groups/ctrun_store.h"
#include "worker_runtime/process_groups/cuda_error.h"
#include "worker_runtime/process_groups/gloo_group.h"
#include "worker_runtime/process_groups/make_group.h"
#include "worker_runtime/process_groups/nccl_group.h"

namespace ctrun::worker {
namespace {

bool is_loopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1";
}

// LibTorch 2.x asks for its libuv TCPStore backend by default and refuses where it was built
// without libuv (Debian's 2.6): then the classic backend, which every build has. Returns whether
// there was a choice to take back (1.13 has none).
template <class Options>
bool without_libuv(Options& options) {
  if constexpr (requires { options.useLibUV; }) {
    if (!options.useLibUV) return false;
    options.useLibUV = false;
    return true;
  } else {
    return false;
  }
}

// Where the ranks meet. Keys carry the restart count, so a restarted job never reads the
// addresses its previous attempt left behind.
c10::intrusive_ptr<c10d::Store> make_store(const WorkerEnv& env,
                                           std::chrono::milliseconds timeout) {
  const std::string attempt = "ctrun/pg/" + std::to_string(env.restart_count) + "/";
  if (env.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  if (env.store) {
    return c10::make_intrusive<CtrunStore>(*env.store, env.run_id, env.store->prefix + attempt,
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
    c10::intrusive_ptr<c10d::TCPStore> tcp;
    try {
      tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("libuv") == std::string::npos || !without_libuv(options)) {
        throw;
      }
      tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    }
    return c10::make_intrusive<c10d::PrefixStore>(attempt, tcp);
  } catch (const std::exception& e) {
    throw CollectiveError("TCPStore at " + env.master_addr + ":" + std::to_string(env.master_port) +
                          ": " + first_line(e.what()));
  }
}

}  // namespace

Backend parse_backend(const std::string& name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  throw std::invalid_argument("backend: expected gloo or nccl, got '" + name + "'");
}

void ProcessGroup::check_chunks(const char* op, const at::Tensor& whole,
                                const at::Tensor& chunk) const {
  if (whole.dim() != 1 || chunk.dim() != 1 || whole.scalar_type() != chunk.scalar_type() ||
      whole.device() != chunk.device() || whole.numel() != chunk.numel() * size()) {
    throw std::invalid_argument(std::string(op) + ": expected 1-D tensors of one type and " +
                                "device, the whole " + std::to_string(size()) +
                                " times the chunk, got " + std::to_string(whole.numel()) + " and " +
                                std::to_string(chunk.numel()) + " elements");
  }
}

const char* backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

std::unique_ptr<ProcessGroup> make_group(const WorkerEnv& env,
                                         const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, const ProcessGroupOptions& options) {
  if (options.backend == Backend::kNccl) {
    auto group = make_nccl_group(store, rank, size, env.local_rank, options.timeout);
    // A planned CUDA error (ctrun --faults) is made on the device this group runs on.
    set_cuda_error_maker([device = env.local_rank](const std::string& message) {
      make_cuda_error(device, message);
    });
    return group;
  }
  // Bind where this host reaches the rendezvous (ctrun) or the master (torchrun): loopback on
  // one host, the right interface on a cluster. GLOO_SOCKET_IFNAME, when set, wins.
  const std::string peer = env.store ? env.store->host : env.master_addr;
  const int peer_port = env.store ? env.store->port : env.master_port;
  std::string host = "127.0.0.1";
  if (!is_loopback(peer)) {
    const auto port = static_cast<std::uint16_t>(peer_port > 0 ? peer_port : 1);
    auto towards = rendezvous::local_address_towards(peer, port);
    host = towards ? towards.value() : "";  // empty: Gloo picks (and says so if it cannot)
  }
  return make_gloo_group(store, rank, size, host, options.timeout);
}

std::unique_ptr<ProcessGroup> init_process_group(const WorkerEnv& env,
                                                 const ProcessGroupOptions& options) {
  return make_group(env, make_store(env, options.timeout), env.rank, env.world_size, options);
}

}  // namespace ctrun::worker
