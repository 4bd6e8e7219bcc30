// The two servers bootstrap_bench compares, each run in a child process of its own (a role of
// the benchmark's binary). Both listen on a free port of 127.0.0.1, write it to `port_file`
// once ready and serve until SIGTERM or SIGINT; they return the exit code.
#pragma once

#include <string>

#include "../store_bench/store_client.h"  // store_bench::run_tcpstore_server: torch's own server

namespace bootstrap_bench {

// ctrun's worker store as an agent that hosts the rendezvous serves it, with its defaults;
// nodes of `round_ranks` workers in all join first, so the job's round is as big as the load.
int run_ctrun_server(const std::string& port_file, int round_ranks);

}  // namespace bootstrap_bench
