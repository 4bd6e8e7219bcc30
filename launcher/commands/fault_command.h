// `ctrun fault --rdzv_endpoint HOST:PORT --rdzv_id ID FAULT`: injects one fault into a running
// job whose agents were started with --faults. The fault goes into the job's store (ctrund's or
// etcd's, with the job's token), the agent that runs its target fires it, and the command waits
// until that agent says it did (docs/faults.md).
#pragma once

#include <string>
#include <vector>

#include "ctrun/launcher/options.h"

namespace ctrun::launcher {

// argv after "fault"; the exit code: 0 injected (or asked for, with --wait=0), 1 unreachable or
// not injected in time, 2 bad flags or a bad fault.
int run_fault_command(const std::vector<std::string>& args, const EnvLookup& env);

}  // namespace ctrun::launcher
