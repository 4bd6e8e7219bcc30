// read_cpu_topology(): the machine through hwloc, for --numa-binding (numa_binding.h).
#include <hwloc.h>

#include <algorithm>
#include <array>
#include <tuple>

#include "launcher/workers/numa_binding.h"

namespace ctrun::launcher {
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kDisplayClass = 0x03;  // PCI base class of GPUs (VGA 0x0300, 3D 0x0302)

class Topology {
 public:
  Topology() {
    if (hwloc_topology_init(&topo_) != 0) return;
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    loaded_ = hwloc_topology_load(topo_) == 0;
  }
  ~Topology() {
    if (topo_) hwloc_topology_destroy(topo_);
    if (allowed_) hwloc_bitmap_free(allowed_);
  }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  bool loaded() const { return loaded_; }
  hwloc_topology_t get() const { return topo_; }

  // What this process may run on: the machine's allowed CPUs (cgroups) and its own affinity.
  bool restrict_to_allowed() {
    allowed_ = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(topo_));
    hwloc_bitmap_t mine = hwloc_bitmap_alloc();
    const bool ok = hwloc_get_cpubind(topo_, mine, HWLOC_CPUBIND_PROCESS) == 0;
    if (ok) hwloc_bitmap_and(allowed_, allowed_, mine);
    hwloc_bitmap_free(mine);
    return ok;
  }

  std::vector<int> allowed_cpus(hwloc_const_cpuset_t set) const {
    std::vector<int> out;
    if (!set) return out;
    for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) {
      if (hwloc_bitmap_isset(allowed_, static_cast<unsigned>(i))) out.push_back(i);
    }
    return out;
  }

  std::vector<std::vector<int>> groups_of(hwloc_obj_type_t type) const {
    std::vector<std::vector<int>> out;
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(topo_, type, nullptr); o;
         o = hwloc_get_next_obj_by_type(topo_, type, o)) {
      auto cpus = allowed_cpus(o->cpuset);
      if (!cpus.empty()) out.push_back(std::move(cpus));
    }
    return out;
  }

 private:
  hwloc_topology_t topo_ = nullptr;
  hwloc_bitmap_t allowed_ = nullptr;
  bool loaded_ = false;
};

}  // namespace

rendezvous::Result<CpuTopology> read_cpu_topology() {
  Topology topo;
  if (!topo.loaded()) {
    return rendezvous::Error{rendezvous::ErrorCode::kInternal,
                             "--numa-binding: hwloc could not read the machine's topology"};
  }
  if (!topo.restrict_to_allowed()) {
    return rendezvous::Error{rendezvous::ErrorCode::kInternal,
                             "--numa-binding: cannot read this process's CPU affinity"};
  }
  CpuTopology t;
  hwloc_topology_t h = topo.get();
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(h, HWLOC_OBJ_NUMANODE, nullptr); n;
       n = hwloc_get_next_obj_by_type(h, HWLOC_OBJ_NUMANODE, n)) {
    CpuTopology::Node node;
    node.os_index = static_cast<int>(n->os_index);
    node.cpus = topo.allowed_cpus(n->cpuset);
    hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(h, HWLOC_OBJ_PACKAGE, n);
    if (!package) {  // a node below no package (hwloc puts some under a group): its CPUs' one
      package = hwloc_get_obj_covering_cpuset(h, n->cpuset);
      while (package && package->type != HWLOC_OBJ_PACKAGE) package = package->parent;
    }
    node.package = package ? static_cast<int>(package->logical_index) : 0;
    if (!node.cpus.empty()) t.nodes.push_back(std::move(node));
  }
  t.cores = topo.groups_of(HWLOC_OBJ_CORE);
  // The last-level cache: the highest level present (torch: the largest unified or data cache).
  for (hwloc_obj_type_t level : {HWLOC_OBJ_L5CACHE, HWLOC_OBJ_L4CACHE, HWLOC_OBJ_L3CACHE,
                                 HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L1CACHE}) {
    t.cache_groups = topo.groups_of(level);
    if (!t.cache_groups.empty()) break;
  }
  // NVIDIA GPUs in PCI bus order, each with the NUMA node it is attached to.
  std::vector<std::tuple<unsigned, unsigned, unsigned, unsigned, int>> gpus;
  for (hwloc_obj_t d = hwloc_get_next_pcidev(h, nullptr); d; d = hwloc_get_next_pcidev(h, d)) {
    const auto& pci = d->attr->pcidev;
    if (pci.vendor_id != kNvidiaVendor || (pci.class_id >> 8) != kDisplayClass) continue;
    hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(h, d);
    int node = host && host->nodeset ? hwloc_bitmap_first(host->nodeset) : 0;
    if (node < 0) node = 0;  // no locality known: node 0, as torch reads numa_node -1
    gpus.emplace_back(pci.domain, pci.bus, pci.dev, pci.func, node);
  }
  std::sort(gpus.begin(), gpus.end());
  for (const auto& g : gpus) t.gpu_nodes.push_back(std::get<4>(g));
  return t;
}

}  // namespace ctrun::launcher
