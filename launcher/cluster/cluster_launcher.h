// `ctrun --hostfile FILE` / `--hosts LIST`: the whole job from one command. It reads the hosts,
// hosts the rendezvous on this machine (unless the command line names one elsewhere, or etcd),
// starts one agent per host over ssh (cluster_plan.h), streams their output with the host in
// front, and ends as the job does (cluster_job.h). docs/cluster.md.
#pragma once

#include <boost/asio/io_context.hpp>

#include "ctrun/launcher/options.h"

namespace ctrun::launcher {

// The launcher's exit code (or it dies of the signal that stopped the job, as the agent does).
int run_cluster(boost::asio::io_context& io, const LaunchOptions& options, const EnvLookup& env);

}  // namespace ctrun::launcher
