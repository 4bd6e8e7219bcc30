// --numa-binding's plan over made-up machines: the four modes, GPUs and none, the refusals.
#include "launcher/workers/numa_binding.h"

#include "catch.h"

using namespace ctrun::launcher;

namespace {

// Two sockets of two NUMA nodes each; every node has 4 cores of 2 threads (CPU c and c + 32 are
// siblings), and two last-level caches of 2 cores. GPUs: 0 and 1 on node 0, 2 on node 1,
// 3 on node 3.
CpuTopology big_machine() {
  CpuTopology t;
  for (int node = 0; node < 4; ++node) {
    CpuTopology::Node n;
    n.os_index = node;
    n.package = node / 2;
    for (int c = node * 4; c < node * 4 + 4; ++c) n.cpus.push_back(c);
    for (int c = node * 4; c < node * 4 + 4; ++c) n.cpus.push_back(c + 32);
    t.nodes.push_back(n);
    for (int c = node * 4; c < node * 4 + 4; ++c) t.cores.push_back({c, c + 32});
    t.cache_groups.push_back({node * 4, node * 4 + 1, node * 4 + 32, node * 4 + 33});
    t.cache_groups.push_back({node * 4 + 2, node * 4 + 3, node * 4 + 34, node * 4 + 35});
  }
  t.gpu_nodes = {0, 0, 1, 3};
  return t;
}

std::vector<CpuBinding> plan(const CpuTopology& t, NumaMode mode, int workers,
                             std::vector<int> devices) {
  auto p = plan_numa_binding(t, mode, workers, devices);
  INFO((p ? "" : p.error().message));
  REQUIRE(p.ok());
  REQUIRE(p.value().size() == static_cast<std::size_t>(workers));
  return p.value();
}

}  // namespace

TEST_CASE("numa binding: node and socket follow each worker's GPU") {
  const auto t = big_machine();
  auto node = plan(t, NumaMode::kNode, 4, {0, 1, 2, 3});
  CHECK(cpu_list_text(node[0].cpus) == "0-3,32-35");
  CHECK(cpu_list_text(node[1].cpus) == "0-3,32-35");
  CHECK(cpu_list_text(node[2].cpus) == "4-7,36-39");
  CHECK(cpu_list_text(node[3].cpus) == "12-15,44-47");
  CHECK(node[2].memory_node == 1);
  CHECK(node[3].memory_node == 3);
  auto socket = plan(t, NumaMode::kSocket, 4, {0, 1, 2, 3});
  CHECK(cpu_list_text(socket[0].cpus) == "0-7,32-39");
  CHECK(cpu_list_text(socket[3].cpus) == "8-15,40-47");
  CHECK(socket[3].memory_node == 3);  // memory stays on the GPU's own node
}

TEST_CASE("numa binding: exclusive shares a node's whole cores out between its GPUs") {
  const auto t = big_machine();
  // GPUs 0 and 1 share node 0's 4 cores: 2 each, both threads of each core.
  auto p = plan(t, NumaMode::kExclusive, 3, {1, 0, 2});
  CHECK(cpu_list_text(p[1].cpus) == "0-1,32-33");  // GPU 0 comes first on its node
  CHECK(cpu_list_text(p[0].cpus) == "2-3,34-35");
  CHECK(cpu_list_text(p[2].cpus) == "4-7,36-39");  // alone on node 1
  // 3 workers without GPUs on a one-node machine of 4 cores: 2, 1, 1.
  CpuTopology small;
  small.nodes.push_back({0, 0, {0, 1, 2, 3}});
  small.cores = {{0}, {1}, {2}, {3}};
  auto q = plan(small, NumaMode::kExclusive, 3, {});
  CHECK(cpu_list_text(q[0].cpus) == "0-1");
  CHECK(cpu_list_text(q[1].cpus) == "2");
  CHECK(cpu_list_text(q[2].cpus) == "3");
  auto too_many = plan_numa_binding(small, NumaMode::kExclusive, 5, {});
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.error().message ==
        "--numa-binding: exclusive: NUMA node 0 has 4 physical cores for 5 workers");
}

TEST_CASE("numa binding: core-complex gives each GPU of a node its own last-level cache") {
  const auto t = big_machine();
  auto p = plan(t, NumaMode::kCoreComplex, 3, {0, 1, 2});
  CHECK(cpu_list_text(p[0].cpus) == "0-1,32-33");
  CHECK(cpu_list_text(p[1].cpus) == "2-3,34-35");
  CHECK(cpu_list_text(p[2].cpus) == "4-5,36-37");
}

TEST_CASE("numa binding: without GPUs, workers are spread over the nodes in rank order") {
  auto t = big_machine();
  t.gpu_nodes.clear();
  auto p = plan(t, NumaMode::kNode, 8, {});
  for (int rank = 0; rank < 8; ++rank) CHECK(p[rank].memory_node == rank / 2);
  auto two = plan(t, NumaMode::kNode, 2, {});
  CHECK(two[0].memory_node == 0);
  CHECK(two[1].memory_node == 2);
}

TEST_CASE("numa binding: each worker's GPU, and what cannot be placed") {
  CHECK(worker_devices(std::nullopt, 3, 4).value() == std::vector<int>{0, 1, 2});
  CHECK(worker_devices(std::string("3,1"), 2, 4).value() == std::vector<int>{3, 1});
  CHECK(worker_devices(std::nullopt, 3, 0).value().empty());
  CHECK(worker_devices(std::string("3"), 2, 4).error().message ==
        "--numa-binding: CUDA_VISIBLE_DEVICES lists 1 devices for 2 workers");
  CHECK(worker_devices(std::string("GPU-1234"), 1, 4).error().message.find("not a device index") !=
        std::string::npos);
  const auto t = big_machine();
  auto missing = plan_numa_binding(t, NumaMode::kNode, 1, {7});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message ==
        "--numa-binding: worker 0 would use GPU 7, but the machine has 4");
  CpuTopology empty;
  CHECK_FALSE(plan_numa_binding(empty, NumaMode::kNode, 1, {}).ok());
  CHECK(parse_numa_mode("core-complex") == NumaMode::kCoreComplex);
  CHECK_FALSE(parse_numa_mode("numa").has_value());
  CHECK(cpu_list_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
}
