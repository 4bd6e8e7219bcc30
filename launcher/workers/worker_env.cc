#include "ctrun/launcher/worker_env.h"

#include <map>
#include <optional>

#include "ctrun/rendezvous/endpoint.h"

namespace ctrun::launcher {
namespace {

std::optional<std::string> variable_in(const std::vector<std::string>& env,
                                       const std::string& name) {
  for (const auto& entry : env) {
    if (entry.size() > name.size() && entry[name.size()] == '=' &&
        entry.compare(0, name.size(), name) == 0) {
      return entry.substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

// CUDA_VISIBLE_DEVICES split on ',' as torchrun splits it (no other parsing).
std::vector<std::string> split_devices(const std::string& list) {
  std::vector<std::string> out{""};
  for (const char ch : list) {
    if (ch == ',') {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

std::string strip(const std::string& s) {
  const char* space = " \t\n\r\f\v";
  const auto first = s.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(space) + 1 - first);
}

}  // namespace

rendezvous::Status check_virtual_local_rank(const LaunchOptions& options, int local_world_size,
                                            const EnvLookup& env) {
  if (!options.virtual_local_rank) return rendezvous::ok_status();
  const auto visible = env("CUDA_VISIBLE_DEVICES");
  if (!visible) return rendezvous::ok_status();
  const auto devices = split_devices(*visible);
  if (static_cast<int>(devices.size()) >= local_world_size) return rendezvous::ok_status();
  return rendezvous::Error{rendezvous::ErrorCode::kBadRequest,
                           "--virtual_local_rank: local rank " + std::to_string(devices.size()) +
                               " exceeds available GPUs in CUDA_VISIBLE_DEVICES=" + *visible +
                               " (" + std::to_string(local_world_size) + " workers per node)"};
}

std::vector<std::string> worker_environment(const std::vector<std::string>& base,
                                            const WorkerEnvInputs& in) {
  const LaunchOptions& o = *in.options;
  const RoundPlacement& p = in.placement;
  const int rank = p.rank_offset + in.local_rank;
  // Ordered so that a dump of the environment is stable; later keys override the base.
  std::map<std::string, std::string> vars = {
      {"LOCAL_RANK", o.virtual_local_rank ? "0" : std::to_string(in.local_rank)},
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
  };
  // NCCL's async error handling as the workers' torch's own agent sets it: the user's value, else
  // 1, under the name that torch reads (2.2 on warns about the old one, twice a rank).
  const bool old_torch = in.torch && *in.torch < TorchVersion{2, 2};
  const bool new_torch = in.torch && !old_torch;
  auto user_or_1 = [&base](const char* name) { return variable_in(base, name).value_or("1"); };
  if (!new_torch) vars["NCCL_ASYNC_ERROR_HANDLING"] = user_or_1("NCCL_ASYNC_ERROR_HANDLING");
  if (!old_torch) {
    vars["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = user_or_1("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  }
  // torch 2.x's agent tells its workers which signals it handles (--signals-to-handle).
  if (!in.torch || in.torch->major >= 2) vars["TORCHELASTIC_SIGNALS_TO_HANDLE"] = o.signals_text;
  // How the workers get in where the agent did: file paths only, never a secret itself.
  const rendezvous::StoreAccess& access = in.store.access;
  const bool etcd = in.store.backend == rendezvous::StoreAddress::Backend::kEtcd;
  if (etcd) {
    vars["CTRUN_STORE_BACKEND"] = "etcd";
    vars["CTRUN_STORE_ADDR"] = rendezvous::format_endpoint_list(in.store.etcd_endpoints);
    vars["CTRUN_STORE_PREFIX"] = in.store.prefix;
    if (!access.user.empty()) {
      vars["CTRUN_STORE_USER"] = access.user;
      vars["CTRUN_STORE_PASSWORD_FILE"] = access.password_file;
    }
  } else if (!in.store.host.empty()) {
    vars["CTRUN_STORE_BACKEND"] = "ctrund";
    vars["CTRUN_STORE_ADDR"] = in.store.host;
    vars["CTRUN_STORE_PORT"] = std::to_string(in.store.port);
    vars["CTRUN_STORE_PREFIX"] = in.store.prefix;
  }
  if (access.tls && (etcd || !in.store.host.empty())) {
    vars["CTRUN_STORE_PROTOCOL"] = etcd ? "https" : "tls";
    if (!access.tls->ca_file.empty()) vars["CTRUN_STORE_CACERT"] = access.tls->ca_file;
    if (!access.tls->cert_file.empty()) vars["CTRUN_STORE_CERT"] = access.tls->cert_file;
    if (!access.tls->key_file.empty()) vars["CTRUN_STORE_KEY"] = access.tls->key_file;
  }
  if (in.store.token) vars["CTRUN_RDZV_TOKEN"] = *in.store.token;
  if (o.virtual_local_rank) {
    // torchrun's _set_local_rank_env: each worker sees only its own device, as device 0.
    const auto visible = variable_in(base, "CUDA_VISIBLE_DEVICES");
    std::string device = std::to_string(in.local_rank);
    if (visible) {
      const auto devices = split_devices(*visible);
      // check_virtual_local_rank refused a list too short before any worker started.
      device =
          in.local_rank < static_cast<int>(devices.size()) ? strip(devices[in.local_rank]) : "";
    }
    vars.emplace("CUDA_VISIBLE_DEVICES", device);
  }
  if (!in.timer_file.empty()) vars["TORCHELASTIC_TIMER_FILE"] = in.timer_file;
  if (!in.heartbeat_file.empty()) vars.emplace("CTRUN_HEARTBEAT_FILE", in.heartbeat_file);
  if (!in.result_file.empty()) vars.emplace("CTRUN_RESULT_FILE", in.result_file);
  if (!in.fault_file.empty()) vars.emplace("CTRUN_FAULT_FILE", in.fault_file);
  if (!in.python_helper_dir.empty()) {
    const auto path = variable_in(base, "PYTHONPATH");
    vars.emplace("PYTHONPATH", path && !path->empty() ? in.python_helper_dir + ":" + *path
                                                      : in.python_helper_dir);
  }
  if (o.fault_tolerance == "step") {
    vars.emplace("CTRUN_FAULT_TOLERANCE", "step");
    vars.emplace("CTRUN_REPLICA_ID", in.replica_id);
    if (!in.worker_proxy.empty()) vars.emplace("CTRUN_WORKER_PROXY", in.worker_proxy);
  }
  if (!in.stacks_file.empty()) {
    vars.emplace("CTRUN_STACKS_FILE", in.stacks_file);
    vars.emplace("CTRUN_STACKS_SIGNAL", std::to_string(in.stacks_signal));
  }
  if (!in.flight_recorder_prefix.empty()) {
    // The buffer on (torch 2.x records nothing by default before 2.11), a dump on a
    // collective's timeout, and a pipe on which a byte asks for one (the agent's hang report).
    // The TORCH_NCCL_ names: torch 2.11 warns that two are deprecated for TORCH_FR_ ones, but
    // given the TORCH_FR_ ones its dump on the pipe's request was not where they name (seen on
    // an H200); earlier torch reads only these.
    const bool sized = variable_in(base, "TORCH_NCCL_TRACE_BUFFER_SIZE").has_value() ||
                       variable_in(base, "TORCH_FR_BUFFER_SIZE").has_value();
    if (!sized) vars.emplace("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000");
    if (!variable_in(base, "TORCH_NCCL_DUMP_ON_TIMEOUT")) {
      vars.emplace("TORCH_NCCL_DUMP_ON_TIMEOUT", std::string(1, '1'));
    }
    if (!variable_in(base, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") &&
        !variable_in(base, "TORCH_FR_DUMP_TEMP_FILE")) {
      vars.emplace("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", in.flight_recorder_prefix);
    }
    if (!variable_in(base, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")) {
      vars.emplace("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", in.flight_recorder_prefix);
    }
  }
  if (in.python_fault_handler && !variable_in(base, "PYTHONFAULTHANDLER")) {
    vars.emplace("PYTHONFAULTHANDLER", std::string(1, '1'));
  }
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

std::optional<TorchVersion> parse_torch_version(const std::string& text) {
  TorchVersion v;
  std::size_t pos = 0;
  auto number = [&](int& out) {
    const std::size_t start = pos;
    while (pos < text.size() && pos - start < 6 && text[pos] >= '0' && text[pos] <= '9') ++pos;
    if (pos == start) return false;
    out = std::stoi(text.substr(start, pos - start));
    return true;
  };
  if (!number(v.major) || pos >= text.size() || text[pos++] != '.' || !number(v.minor)) {
    return std::nullopt;
  }
  return v;
}

const char* const kTorchVersionProbe =
    "import importlib.util as u, os\n"
    "s = u.find_spec('torch')\n"
    "d = list(s.submodule_search_locations or []) if s else []\n"
    "p = os.path.join(d[0], 'version.py') if d else ''\n"
    "ns = {}\n"
    "if p and os.path.isfile(p):\n"
    "    exec(compile(open(p).read(), p, 'exec'), ns)\n"
    "print(ns.get('__version__', ''))\n";

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
