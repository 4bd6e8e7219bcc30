// The two servers bootstrap_bench compares, each run in a child process of its own (a role of
// the benchmark's binary). Both listen on a free port of 127.0.0.1, write it to `port_file`
// and serve until SIGTERM or SIGINT; they return the exit code.
#pragma once

#include <string>

#include "../store_bench/store_client.h"  // store_bench::run_tcpstore_server: torch's own server

namespace bootstrap_bench {

// ctrun's worker store: a rendezvous::Server with worker_store_job set, as an agent hosts it,
// with the connection limits raised (every simulated rank connects from 127.0.0.1).
int run_ctrun_server(const std::string& port_file);

}  // namespace bootstrap_bench
