#include "launcher/workers/numa_binding.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <sstream>

namespace ctrun::launcher {
namespace {

using rendezvous::Error;
using rendezvous::ErrorCode;

Error binding_error(const std::string& message) {
  return Error{ErrorCode::kBadRequest, "--numa-binding: " + message};
}

const CpuTopology::Node* find_node(const CpuTopology& t, int os_index) {
  for (const auto& n : t.nodes) {
    if (n.os_index == os_index) return &n;
  }
  return nullptr;
}

// The members of `group` that are also in `within` (both ascending).
std::vector<int> intersect(const std::vector<int>& group, const std::vector<int>& within) {
  std::vector<int> out;
  std::set_intersection(group.begin(), group.end(), within.begin(), within.end(),
                        std::back_inserter(out));
  return out;
}

// The groups (cores, cache groups) of `node`, cut to its CPUs, ordered by their first CPU.
std::vector<std::vector<int>> groups_in(const std::vector<std::vector<int>>& groups,
                                        const CpuTopology::Node& node) {
  std::vector<std::vector<int>> out;
  for (const auto& g : groups) {
    auto mine = intersect(g, node.cpus);
    if (!mine.empty()) out.push_back(std::move(mine));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::optional<NumaMode> parse_numa_mode(const std::string& text) {
  if (text == "node") return NumaMode::kNode;
  if (text == "socket") return NumaMode::kSocket;
  if (text == "exclusive") return NumaMode::kExclusive;
  if (text == "core-complex") return NumaMode::kCoreComplex;
  return std::nullopt;
}

rendezvous::Result<std::vector<int>> worker_devices(const std::optional<std::string>& visible,
                                                    int local_world_size, int gpus) {
  std::vector<int> devices;
  if (gpus == 0) return devices;
  std::vector<std::string> listed;
  if (visible && !visible->empty()) {
    std::istringstream in(*visible);
    for (std::string item; std::getline(in, item, ',');) listed.push_back(item);
  }
  for (int rank = 0; rank < local_world_size; ++rank) {
    if (listed.empty()) {
      devices.push_back(rank);
      continue;
    }
    if (rank >= static_cast<int>(listed.size())) {
      return binding_error("CUDA_VISIBLE_DEVICES lists " + std::to_string(listed.size()) +
                           " devices for " + std::to_string(local_world_size) + " workers");
    }
    int index = -1;
    const std::string& item = listed[rank];
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), index);
    if (ec != std::errc() || end != item.data() + item.size() || index < 0) {
      return binding_error("CUDA_VISIBLE_DEVICES entry '" + item +
                           "' is not a device index (UUIDs cannot be placed)");
    }
    devices.push_back(index);
  }
  return devices;
}

rendezvous::Result<std::vector<CpuBinding>> plan_numa_binding(const CpuTopology& topology,
                                                              NumaMode mode, int local_world_size,
                                                              const std::vector<int>& devices) {
  if (topology.nodes.empty()) return binding_error("no NUMA node with a CPU this agent may use");
  // Each worker's anchor node, and its place among the workers anchored there (exclusive and
  // core-complex share a node's CPUs out between them). With GPUs, the order within a node is
  // the GPUs', as torch's; without, the local ranks'.
  std::vector<int> anchor(local_world_size);
  for (int rank = 0; rank < local_world_size; ++rank) {
    if (devices.empty()) {
      const auto& n = topology.nodes[static_cast<std::size_t>(rank) * topology.nodes.size() /
                                     static_cast<std::size_t>(local_world_size)];
      anchor[rank] = n.os_index;
      continue;
    }
    const int device = devices.at(rank);
    if (device >= static_cast<int>(topology.gpu_nodes.size())) {
      return binding_error("worker " + std::to_string(rank) + " would use GPU " +
                           std::to_string(device) + ", but the machine has " +
                           std::to_string(topology.gpu_nodes.size()));
    }
    const int gpu_node = topology.gpu_nodes[device];
    if (!find_node(topology, gpu_node)) {
      return binding_error("GPU " + std::to_string(device) + " sits on NUMA node " +
                           std::to_string(gpu_node) + ", none of whose CPUs this agent may use");
    }
    anchor[rank] = gpu_node;
  }
  std::map<int, std::vector<int>> sharing;  // node -> local ranks anchored there, in order
  for (int rank = 0; rank < local_world_size; ++rank) sharing[anchor[rank]].push_back(rank);
  for (auto& [node, ranks] : sharing) {
    if (!devices.empty()) {
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](int a, int b) { return devices[a] < devices[b]; });
    }
  }

  std::vector<CpuBinding> plan;
  for (int rank = 0; rank < local_world_size; ++rank) {
    const CpuTopology::Node& node = *find_node(topology, anchor[rank]);
    const auto& peers = sharing[anchor[rank]];
    const auto place =
        static_cast<std::size_t>(std::find(peers.begin(), peers.end(), rank) - peers.begin());
    CpuBinding b;
    b.memory_node = node.os_index;
    switch (mode) {
      case NumaMode::kNode:
        b.cpus = node.cpus;
        break;
      case NumaMode::kSocket:
        for (const auto& other : topology.nodes) {
          if (other.package == node.package) {
            b.cpus.insert(b.cpus.end(), other.cpus.begin(), other.cpus.end());
          }
        }
        std::sort(b.cpus.begin(), b.cpus.end());
        break;
      case NumaMode::kExclusive: {
        // Whole physical cores, shared out: the first (cores % workers) get one more.
        const auto cores = groups_in(topology.cores, node);
        const std::size_t each = cores.size() / peers.size();
        if (each == 0) {
          return binding_error("exclusive: NUMA node " + std::to_string(node.os_index) + " has " +
                               std::to_string(cores.size()) + " physical cores for " +
                               std::to_string(peers.size()) + " workers");
        }
        const std::size_t extra = cores.size() % peers.size();
        const std::size_t first = place * each + std::min(place, extra);
        const std::size_t count = each + (place < extra ? 1 : 0);
        for (std::size_t c = first; c < first + count; ++c) {
          b.cpus.insert(b.cpus.end(), cores[c].begin(), cores[c].end());
        }
        std::sort(b.cpus.begin(), b.cpus.end());
        break;
      }
      case NumaMode::kCoreComplex: {
        // The CPUs behind one last-level cache, largest groups first.
        auto groups = groups_in(topology.cache_groups, node);
        if (groups.empty()) groups.push_back(node.cpus);
        std::stable_sort(groups.begin(), groups.end(),
                         [](const auto& a, const auto& b) { return a.size() > b.size(); });
        b.cpus = groups[place % groups.size()];
        break;
      }
    }
    if (b.cpus.empty()) {
      return binding_error("worker " + std::to_string(rank) + " would have no CPU to run on");
    }
    plan.push_back(std::move(b));
  }
  return plan;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ctrun::launcher
