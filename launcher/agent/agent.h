// The per-node agent: hosts or reaches the rendezvous, joins each round, runs the local workers
// with torchrun's environment, and turns what happens (a worker exit, a reopened round, the
// job's end, a signal, a lost daemon) into the next step. Everything runs on one io_context.
#pragma once

#include <boost/asio/io_context.hpp>

#include <functional>
#include <memory>

#include "ctrun/launcher/options.h"
#include "launcher/workers/worker_runner.h"
#include "rendezvous/backend/backend.h"

namespace ctrun::launcher {

// What the agent uses of the world that a test replaces with fakes; each left empty is the real
// one.
struct AgentWorld {
  // The workers of each round (default: WorkerGroup, processes).
  std::function<std::unique_ptr<WorkerRunner>(boost::asio::io_context&)> make_workers;
  // The rendezvous the command line names (default: rendezvous::make_backend).
  std::function<std::unique_ptr<rendezvous::Backend>(boost::asio::io_context&,
                                                     rendezvous::BackendSpec)>
      make_backend;
  // Whether the agent becomes its workers' descendants' subreaper (the process-wide
  // PR_SET_CHILD_SUBREAPER) and reaps and kills what they leave.
  bool adopt_orphans = true;
};

class Agent {
 public:
  Agent(boost::asio::io_context& io, LaunchOptions options, int local_world_size,
        AgentWorld world = {});
  ~Agent();
  // Runs the job to its end on the io_context and returns the agent's exit code:
  // 0 success, 1 failure (or stopped by a signal), as torchrun.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun::launcher
