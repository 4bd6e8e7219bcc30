#include "ctrun/launcher/worker_env.h"

#include <map>

#include "ctrun/rendezvous/etcd.h"

namespace ctrun::launcher {

std::vector<std::string> worker_environment(const std::vector<std::string>& base,
                                            const WorkerEnvInputs& in) {
  const LaunchOptions& o = *in.options;
  const RoundPlacement& p = in.placement;
  const int rank = p.rank_offset + in.local_rank;
  // Ordered so that a dump of the environment is stable; later keys override the base.
  std::map<std::string, std::string> vars = {
      {"LOCAL_RANK", std::to_string(in.local_rank)},
      {"RANK", std::to_string(rank)},
      {"GROUP_RANK", std::to_string(p.group_rank)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_NAME", o.role},
      {"LOCAL_WORLD_SIZE", std::to_string(in.local_world_size)},
      {"WORLD_SIZE", std::to_string(p.world_size)},
      {"GROUP_WORLD_SIZE", std::to_string(p.group_world_size)},
      {"ROLE_WORLD_SIZE", std::to_string(p.world_size)},
      {"MASTER_ADDR", p.master_addr},
      {"MASTER_PORT", std::to_string(p.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(p.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", in.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", in.use_agent_store ? "True" : "False"},
      {"TORCHELASTIC_ERROR_FILE", in.error_file},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
  };
  if (in.store.backend == rendezvous::StoreAddress::Backend::kEtcd) {
    vars["CTRUN_STORE_BACKEND"] = "etcd";
    vars["CTRUN_STORE_ADDR"] = rendezvous::etcd::format_endpoints(in.store.etcd_endpoints);
    vars["CTRUN_STORE_PREFIX"] = in.store.prefix;
  } else if (!in.store.host.empty()) {
    vars["CTRUN_STORE_BACKEND"] = "ctrund";
    vars["CTRUN_STORE_ADDR"] = in.store.host;
    vars["CTRUN_STORE_PORT"] = std::to_string(in.store.port);
    vars["CTRUN_STORE_PREFIX"] = in.store.prefix;
  }
  if (in.store.token) vars["CTRUN_RDZV_TOKEN"] = *in.store.token;
  if (!in.heartbeat_file.empty()) vars.emplace("CTRUN_HEARTBEAT_FILE", in.heartbeat_file);
  // emplace, not operator[] = "1": g++ 12 warns falsely (-Wrestrict) on that assignment
  if (in.set_omp_num_threads) vars.emplace("OMP_NUM_THREADS", std::string(1, '1'));

  std::vector<std::string> env;
  env.reserve(base.size() + vars.size());
  for (const auto& entry : base) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos || vars.count(entry.substr(0, eq)) != 0) continue;
    env.push_back(entry);
  }
  for (const auto& [k, v] : vars) {
    std::string line;
    line.reserve(k.size() + 1 + v.size());
    line.append(k).append(1, '=').append(v);
    env.push_back(std::move(line));
  }
  return env;
}

WorkerCommand worker_command(const LaunchOptions& o, const std::string& python_exec) {
  const bool python_script =
      o.entrypoint.size() > 3 && o.entrypoint.compare(o.entrypoint.size() - 3, 3, ".py") == 0;
  WorkerCommand cmd;
  if (o.no_python || (!o.module && !o.run_path && !python_script)) {
    cmd.executable = o.entrypoint;
    cmd.args = o.script_args;
    return cmd;
  }
  cmd.executable = python_exec;
  cmd.args = {"-u"};
  if (o.module) cmd.args.push_back("-m");
  cmd.args.push_back(o.entrypoint);
  cmd.args.insert(cmd.args.end(), o.script_args.begin(), o.script_args.end());
  return cmd;
}

}  // namespace ctrun::launcher
