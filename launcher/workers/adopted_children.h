// Descendants of the workers that outlive their parents (a data loader's helper, a process that
// daemonized) are re-parented to the agent, a child subreaper (PR_SET_CHILD_SUBREAPER), instead
// of to init: the agent reaps them when they exit (no zombies, also when it runs as a
// container's PID 1) and kills them with the workers, so nothing of a job outlives it.
//
// The agent's own children are its workers (whose pids the caller gives) and the processes it
// runs in its own process group (the eu-stack probe); any other child was adopted. Its own are
// left alone: Boost.Process waits for them, and reaping one here would lose its exit status.
#pragma once

#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

rendezvous::Status become_child_subreaper();

// The adopted children of this process now (from /proc/self/task/*/children).
std::vector<int> adopted_children(const std::vector<int>& workers);

// Reaps the adopted children that have exited; how many.
int reap_adopted_children(const std::vector<int>& workers);

// SIGKILLs every adopted child, and the children they leave in turn, and reaps them; bounded
// (`rounds` passes of at most 10 ms each). How many were killed.
int kill_adopted_children(const std::vector<int>& workers, int rounds = 50);

}  // namespace ctrun::launcher
