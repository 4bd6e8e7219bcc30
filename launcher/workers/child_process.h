// How the agent starts a child process (a worker, eu-stack for a hung worker's stacks): the one
// place that runs code between fork and exec, so that every child starts alike: none of the
// agent's descriptors (its rendezvous connection, the other workers' pipes), killed when the
// agent dies, signal dispositions and mask as a fresh process has them. A worker also gets a
// process group of its own, the agent's leave to trace it, its --numa-binding and the user's
// open-file limit.
#pragma once

#include <sys/resource.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "launcher/workers/numa_binding.h"

namespace ctrun::launcher {

struct ChildOptions {
  // Its own process group, so that a signal to the group reaches the child's children too.
  bool own_process_group = false;
  // Under Yama's ptrace_scope=1 only ancestors may trace: the agent and its children (eu-stack)
  // may trace this one.
  bool traceable_by_agent = false;
  std::optional<CpuBinding> binding;
  // The limit to put back where the agent raised its own (WorkerGroup::ensure_descriptors).
  std::optional<rlimit> open_files;
  // The child's whole environment ("NAME=value"); absent: the agent's.
  std::optional<std::vector<std::string>> environment;
};

// `executable` without a '/' is looked up on PATH. Errors say what could not be started and
// why, in our words (a script without its interpreter, a file without +x).
rendezvous::Result<std::unique_ptr<boost::process::v2::process>> start_child(
    boost::asio::any_io_executor executor, const std::string& executable,
    const std::vector<std::string>& args, boost::process::v2::process_stdio stdio,
    const ChildOptions& options);

}  // namespace ctrun::launcher
