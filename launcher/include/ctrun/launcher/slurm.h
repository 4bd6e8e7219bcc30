// Running under Slurm: the compressed node-list grammar (SLURM_JOB_NODELIST) and the mapping from
// an allocation's environment to ctrun's options, pure so that both are tested in memory.
#pragma once

#include <string>
#include <vector>

#include "ctrun/launcher/options.h"

namespace ctrun::launcher {

// Expands a Slurm host list such as "gpu[01-04,07],cpu3" or "rack[1-2]-n[08-10]" into host
// names, in order. Zero padding follows the range's first bound ("[08-10]" gives 08, 09, 10);
// several bracket groups in one name multiply out. `what` names the variable in errors.
Result<std::vector<std::string>> expand_hostlist(const std::string& text, const std::string& what);

// The facts ctrun --slurm reads from the step's environment.
struct SlurmFacts {
  std::string job_id;
  int nnodes = 0;
  int node_id = 0;
  std::vector<std::string> hosts;  // the step's nodes, node id order
  int gpus_on_node = 0;            // 0: unknown
};
Result<SlurmFacts> read_slurm_environment(const EnvLookup& env);

// The rendezvous port of a Slurm job: derived from the job id so that two jobs sharing their
// first node do not collide (29400 + job id mod 10000, skipping torch's 29500).
int slurm_rendezvous_port(const std::string& job_id);

// Which options the user set (by flag or PET_ variable) and --slurm must leave alone.
struct ExplicitOptions {
  bool nnodes = false;
  bool node_rank = false;
  bool nproc_per_node = false;
  bool rdzv_backend = false;
  bool rdzv_endpoint = false;
  bool rdzv_id = false;
  bool master_addr = false;
  bool master_port = false;
};

// Fills what the user left out from the allocation: node count, this node's rank, a ctrund
// rendezvous hosted by node 0 on the first host, the run id and the worker count (GPUs on the
// node). Errors name the Slurm variable at fault.
rendezvous::Status apply_slurm(const SlurmFacts& facts, const ExplicitOptions& given,
                               LaunchOptions& options);

}  // namespace ctrun::launcher
