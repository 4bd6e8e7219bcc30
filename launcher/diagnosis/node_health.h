// The node's health before each join (health_checks.h decides): the GPU memory of the workers
// just stopped waited for, then the checks (free space, the GPUs through NVML, the user's
// command), again every interval while they fail, up to a limit. The agent's join task awaits
// it, so a stop signal is answered as in the joining phase.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <functional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/task.h"
#include "launcher/diagnosis/health_checks.h"

namespace ctrun::launcher {

class NodeHealth {
 public:
  struct Hooks {
    std::function<void(const std::string& line)> log;
    std::function<void(const std::string& name, rendezvous::Json fields)> event;
  };
  // `host` names this node in the lines.
  NodeHealth(boost::asio::any_io_executor executor, HealthSettings settings, std::string host,
             Hooks hooks);

  // The workers of the group just stopped: the next wait first lets their GPU memory go.
  void workers_stopped(const std::vector<int>& pids);
  // Ok once the node is healthy; an error naming every problem once it has been unhealthy for
  // `limit` (the join timeout).
  rendezvous::Task<rendezvous::Status> wait_until_healthy(rendezvous::Duration limit);
  // Why the last check failed; empty: healthy (for the agent's waiting line).
  const std::string& unhealthy() const { return unhealthy_; }

 private:
  rendezvous::Task<std::vector<HealthProblem>> check();
  rendezvous::Task<void> await_gpu_release(std::vector<int> stopped);

  boost::asio::any_io_executor executor_;
  HealthSettings settings_;
  std::string host_;
  Hooks hooks_;
  std::vector<int> stopped_;
  std::string unhealthy_;
};

}  // namespace ctrun::launcher
