// ctrun: the per-node agent, a drop-in for torchrun.
#include <signal.h>

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ctrun/launcher/options.h"
#include "ctrun/launcher/worker_env.h"
#include "launcher/agent/agent.h"
#include "launcher/cluster/cluster_launcher.h"
#include "launcher/commands/fault_command.h"
#include "launcher/commands/status_command.h"
#include "worker_runtime/quorum/worker_proxy.h"

int main(int argc, char** argv) {
  using namespace ctrun::launcher;
  std::signal(SIGPIPE, SIG_IGN);
  // A parent that ignores SIGCHLD would make the kernel reap our workers before we see how
  // they ended.
  std::signal(SIGCHLD, SIG_DFL);
  const EnvLookup env = process_env();
  // A subcommand, not an option: torchrun has none, so "status" first cannot be a torchrun
  // command line (a program named status is run as ./status).
  if (argc > 1 && std::string(argv[1]) == "status") {
    return run_status_command(std::vector<std::string>(argv + 2, argv + argc), env);
  }
  if (argc > 1 && std::string(argv[1]) == "fault") {
    return run_fault_command(std::vector<std::string>(argv + 2, argv + argc), env);
  }
  // Not for people: the quorum and store proxy that a Python worker of --fault_tolerance=step
  // starts as its child (ctrun_worker.FaultTolerance; the agent names this executable to it).
  if (argc > 1 && std::string(argv[1]) == "worker-proxy") {
    ctrun::worker::exit_with_parent();
    std::_Exit(ctrun::worker::run_worker_proxy(ctrun::worker::process_environment(), 0, 1));
  }
  auto parsed = parse_launch_options(std::vector<std::string>(argv + 1, argv + argc), env);
  if (!parsed) {
    std::fprintf(stderr, "ctrun: error: %s\n", parsed.error().message.c_str());
    return 2;
  }
  if (parsed.value().outcome != ParseOutcome::kRun) {
    std::fputs(parsed.value().text.c_str(), stdout);
    return 0;
  }
  LaunchOptions& options = parsed.value().options;
  if (options.cluster) {  // --hostfile / --hosts: this ctrun launches the agents over ssh
    boost::asio::io_context io;
    return run_cluster(io, options, env);
  }
  auto nproc = resolve_nproc(options.nproc_per_node, probe_machine(env));
  if (!nproc) {
    std::fprintf(stderr, "ctrun: error: %s\n", nproc.error().message.c_str());
    return 2;
  }
  if (auto s = check_virtual_local_rank(options, nproc.value(), env); !s) {
    std::fprintf(stderr, "ctrun: error: %s\n", s.error().message.c_str());
    return 2;
  }
  boost::asio::io_context io;
  Agent agent(io, std::move(options), nproc.value());
  return agent.run();
}
