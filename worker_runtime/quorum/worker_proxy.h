// `ctrun worker-proxy`: a Python worker's way to its job's per-step quorum and store
// (ctrun_worker.FaultTolerance starts one as its child). It reads requests from `in_fd` and
// writes answers to `out_fd`, one JSON line each (proxy_messages.h): quorum requests on one
// connection (the replica's, kept across a daemon restart by QuorumAsker, beating while idle),
// store requests on another, each in its own thread so a long store wait does not hold an ask.
//
// It is part of its worker: it ends when its input closes or its parent changes (the worker
// died, even while a forked child such as a DataLoader worker still holds the pipe), and its
// connections close with it, so the quorum lets the replica go at once, as a C++ worker's own
// connection would.
#pragma once

#include "ctrun/worker/env.h"

namespace ctrun::worker {

// Serves until the input closes; returns the exit status: 0 then, 2 when the environment is not
// a fault-tolerant worker's (one line on stderr says why). Threads blocked in an ask or a store
// wait stay behind: the caller ends the process without running destructors (std::_Exit), and
// the kernel closes the connections.
int run_worker_proxy(const EnvLookup& env, int in_fd, int out_fd);

// Ends this process (status 0) once its parent is gone: the worker died, even while a child it
// forked (a DataLoader worker) holds the proxy's input open. A thread checks every 50 ms.
void exit_with_parent();

}  // namespace ctrun::worker
