// `ctrun status --rdzv_endpoint HOST:PORT [--rdzv_id ID] [--json]`: what the rendezvous knows
// of one job (round, state, nodes with their last heartbeat, restarts used and left) or of every
// job it holds.
#pragma once

#include <string>
#include <vector>

#include "ctrun/launcher/options.h"

namespace ctrun::launcher {

// argv after "status"; the process exit code: 0 shown, 1 unreachable or no such job, 2 bad flags.
int run_status_command(const std::vector<std::string>& args, const EnvLookup& env);

}  // namespace ctrun::launcher
