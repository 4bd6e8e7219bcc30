// What `ctrun --hostfile` runs on each host, decided without touching the network: the agent's
// command line (the job's node range, the host's worker count and slots, the rendezvous, the
// forwarded environment), the shell command that starts it in this working directory, and the
// ssh command that carries it there. Pure; cluster_launcher.h carries it out.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ctrun/launcher/options.h"
#include "launcher/cli/host_list.h"

namespace ctrun::launcher {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// What the plan needs to know of the launching machine.
struct ClusterFacts {
  std::string cwd;
  std::string ctrun_path;   // this executable: the hosts run the same path unless told another
  std::string control_dir;  // where ssh keeps its shared connections (ControlPath)
  std::string job_id;       // used when --rdzv_id is not given
  std::string endpoint;     // where every host reaches the rendezvous: host:port, or etcd's list
  EnvVars environment;      // the launcher's own variables
  EnvVars env_file;         // the env files' NAME=VALUE lines, later ones winning
};

struct HostPlan {
  std::string host;
  std::string nproc;                    // --nproc_per_node for its agent
  std::string cuda_visible_devices;     // the slots picked of a narrowed host; empty: untouched
  std::vector<std::string> agent_argv;  // ctrun and its arguments, as the host runs them
  std::string remote_command;           // the shell command ssh hands the host
  std::vector<std::string> ssh_argv;    // the whole local command
  std::string log_file;                 // the launcher's copy of its output; empty: none
};

struct ClusterPlan {
  int min_nodes = 1;
  int max_nodes = 1;
  std::string job_id;
  std::vector<std::string> forwarded;  // the names of the variables every host gets
  std::vector<HostPlan> hosts;
};

// The variables sent to every host without being named: the libraries' and launchers' own
// settings (NCCL_*, GLOO_*, TORCH_*, TORCHELASTIC_*, PYTHON*, UCX_*, FI_*, OMP_*, CTRUN_*).
const std::vector<std::string>& default_forwarded_env();

rendezvous::Result<ClusterPlan> plan_cluster(const LaunchOptions& options,
                                             const std::vector<Host>& hosts,
                                             const ClusterFacts& facts);

// An env file: NAME=VALUE lines (the value taken as written, up to the line's end; an optional
// `export ` before the name), '#' comments and blank lines. `source` names it in errors.
rendezvous::Result<EnvVars> parse_env_file(const std::string& text, const std::string& source);

// `text` as one word for a POSIX shell: 'single-quoted', with ' written '\''.
std::string shell_quote(const std::string& text);
// A command line split into words as a shell would, for quotes and backslashes only (no
// variables, no globs): what --ssh "ssh -i key -o 'Opt=a b'" names.
rendezvous::Result<std::vector<std::string>> split_command_line(const std::string& text);

}  // namespace ctrun::launcher
