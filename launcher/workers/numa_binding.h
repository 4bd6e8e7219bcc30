// --numa-binding: which CPUs (and which NUMA node's memory) each local worker gets, as torchrun's
// modes choose them (torch/numa/binding.py): node, socket, exclusive, core-complex. The plan is
// pure, over a CpuTopology; read_cpu_topology() fills one from hwloc; the worker applies its
// binding between fork and exec (worker_group.cc).
//
// Each worker is anchored at a NUMA node: its GPU's (GPU = CUDA_VISIBLE_DEVICES[local rank], or
// the local rank; GPUs counted in PCI bus order, as nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID
// number them). Without GPUs (a CPU job) ctrun goes beyond torchrun, which refuses: workers are
// spread evenly over the NUMA nodes in local-rank order.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

enum class NumaMode { kNode, kSocket, kExclusive, kCoreComplex };
std::optional<NumaMode> parse_numa_mode(const std::string& text);  // torchrun's names

// The CPUs this agent may use (its affinity and cgroup), grouped the ways the modes need.
struct CpuTopology {
  struct Node {
    int os_index = 0;
    int package = 0;        // the socket it belongs to
    std::vector<int> cpus;  // allowed logical CPUs, ascending
  };
  std::vector<Node> nodes;                     // NUMA nodes with at least one allowed CPU
  std::vector<std::vector<int>> cores;         // allowed CPUs of each physical core
  std::vector<std::vector<int>> cache_groups;  // allowed CPUs sharing a last-level cache
  std::vector<int> gpu_nodes;                  // NUMA node (os index) of each NVIDIA GPU
};

struct CpuBinding {
  std::vector<int> cpus;  // ascending, not empty
  int memory_node = 0;    // preferred for allocations
};

// One binding per local rank. `devices`: each worker's GPU index (empty: a job without GPUs).
rendezvous::Result<std::vector<CpuBinding>> plan_numa_binding(const CpuTopology& topology,
                                                              NumaMode mode, int local_world_size,
                                                              const std::vector<int>& devices);

// Each worker's GPU: CUDA_VISIBLE_DEVICES's entry for its local rank when the variable lists
// indices, else the local rank. Empty when the machine has no GPU.
rendezvous::Result<std::vector<int>> worker_devices(const std::optional<std::string>& visible,
                                                    int local_world_size, int gpus);

// The machine as hwloc sees it, limited to the CPUs this process may run on.
rendezvous::Result<CpuTopology> read_cpu_topology();

// "0-3,8" for the logs and the tests.
std::string cpu_list_text(const std::vector<int>& cpus);

}  // namespace ctrun::launcher
