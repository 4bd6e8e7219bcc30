// The per-node agent: hosts or reaches the rendezvous, joins each round, runs the local workers
// with torchrun's environment, and turns what happens (a worker exit, a reopened round, the
// job's end, a signal, a lost daemon) into the next step. Everything runs on one io_context.
#pragma once

#include <boost/asio/io_context.hpp>

#include <memory>

#include "ctrun/launcher/options.h"

namespace ctrun::launcher {

class Agent {
 public:
  Agent(boost::asio::io_context& io, LaunchOptions options, int local_world_size);
  ~Agent();
  // Runs the job to its end on the io_context and returns the agent's exit code:
  // 0 success, 1 failure (or stopped by a signal), as torchrun.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun::launcher
