// read_cpu_topology() of a ctrun built without hwloc (launcher/CMakeLists.txt): --numa-binding
// then fails with a clear reason instead of binding wrongly.
#include "launcher/workers/numa_binding.h"

namespace ctrun::launcher {

rendezvous::Result<CpuTopology> read_cpu_topology() {
  return rendezvous::Error{rendezvous::ErrorCode::kBadRequest,
                           "--numa-binding: this ctrun was built without hwloc (libhwloc-dev), "
                           "which it needs to read the machine's topology"};
}

}  // namespace ctrun::launcher
