#include "ctrun/launcher/options.h"

#include <dirent.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <sstream>

#include "ctrun/launcher/slurm.h"
#include "option_text.h"

namespace ctrun::launcher {
namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

std::optional<double> to_number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || v != v) return std::nullopt;
  return v;
}

constexpr std::array<std::pair<const char*, int>, 12> kSignals{{
    {"SIGTERM", SIGTERM},
    {"SIGINT", SIGINT},
    {"SIGHUP", SIGHUP},
    {"SIGQUIT", SIGQUIT},
    {"SIGUSR1", SIGUSR1},
    {"SIGUSR2", SIGUSR2},
    {"SIGKILL", SIGKILL},
    {"SIGABRT", SIGABRT},
    {"SIGSEGV", SIGSEGV},
    {"SIGBUS", SIGBUS},
    {"SIGFPE", SIGFPE},
    {"SIGPIPE", SIGPIPE},
}};

}  // namespace

std::optional<int> signal_from_name(const std::string& name) {
  const std::string full = name.rfind("SIG", 0) == 0 ? name : "SIG" + name;
  for (const auto& [n, v] : kSignals) {
    if (full == n) return v;
  }
  return std::nullopt;
}

std::string signal_name(int signo) {
  for (const auto& [n, v] : kSignals) {
    if (v == signo) return n;
  }
  return "signal " + std::to_string(signo);
}

Result<StdSpec> parse_std_spec(const std::string& text, const std::string& flag) {
  auto expected = [&] {
    return bad(flag + ": expected 0-3 or a map like 0:1,1:2 (local rank:0-3), got '" + text + "'");
  };
  StdSpec spec;
  const std::string t = trim(text);
  if (t.find(':') == std::string::npos) {
    auto v = to_int(t);
    if (!v || *v < 0 || *v > 3) return expected();
    spec.all = static_cast<int>(*v);
    return spec;
  }
  for (const auto& item : split(t, ',')) {
    auto parts = split(trim(item), ':');
    if (parts.size() != 2) return expected();
    auto rank = to_int(trim(parts[0]));
    auto value = to_int(trim(parts[1]));
    if (!rank || !value || *rank < 0 || *value < 0 || *value > 3) return expected();
    spec.per_rank[static_cast<int>(*rank)] = static_cast<int>(*value);
  }
  return spec;
}

Result<RendezvousConf> parse_rdzv_conf(const std::string& text) {
  RendezvousConf conf;
  if (trim(text).empty()) return conf;
  for (const auto& raw : split(text, ',')) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      return bad("--rdzv_conf: expected key=value pairs separated by commas, got '" + item + "'");
    }
    const std::string key = trim(item.substr(0, eq));
    const std::string value = trim(item.substr(eq + 1));
    auto seconds = [&](double& out) -> rendezvous::Status {
      auto v = to_number(value);
      if (!v || *v < 0) {
        return bad("--rdzv_conf: " + key + " must be a non-negative number of seconds, got '" +
                   value + "'");
      }
      out = *v;
      return rendezvous::ok_status();
    };
    if (key == "join_timeout" || key == "timeout") {
      if (auto s = seconds(conf.join_timeout); !s) return s.error();
    } else if (key == "last_call_timeout") {
      if (auto s = seconds(conf.last_call_timeout); !s) return s.error();
    } else if (key == "close_timeout") {
      if (auto s = seconds(conf.close_timeout); !s) return s.error();
    } else if (key == "keep_alive_interval") {
      if (auto s = seconds(conf.keep_alive_interval); !s) return s.error();
    } else if (key == "keep_alive_max_attempt") {
      auto v = to_int(value);
      if (!v || *v < 1) {
        return bad("--rdzv_conf: keep_alive_max_attempt must be a positive integer, got '" + value +
                   "'");
      }
      conf.keep_alive_max_attempt = static_cast<int>(*v);
    } else if (key == "is_host") {
      std::string v = value;
      std::transform(v.begin(), v.end(), v.begin(), ::tolower);
      if (v == "1" || v == "true" || v == "yes") {
        conf.is_host = true;
      } else if (v == "0" || v == "false" || v == "no") {
        conf.is_host = false;
      } else {
        return bad("--rdzv_conf: is_host must be true or false, got '" + value + "'");
      }
    } else if (key == "token_file") {
      if (value.empty()) return bad("--rdzv_conf: token_file is empty");
      conf.token_file = value;
    } else {
      conf.ignored_keys.push_back(key);
    }
  }
  if (conf.join_timeout <= 0) return bad("--rdzv_conf: join_timeout must be positive");
  if (conf.keep_alive_interval <= 0)
    return bad("--rdzv_conf: keep_alive_interval must be positive");
  return conf;
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<Parsed> parse_launch_options(const std::vector<std::string>& args, const EnvLookup& env) {
  CLI::App app{"ctrun: a torchrun-compatible elastic launcher for distributed training", "ctrun"};
  app.prefix_command();  // everything from the entrypoint on belongs to the workers
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.set_version_flag("--version", "ctrun " CTRUN_VERSION);

  // Every option reads as a string first, so that its error names it in our own words.
  std::map<std::string, std::string> values;
  std::map<std::string, bool> flags;
  struct Spec {
    const char* names;  // CLI11 names: both spellings
    const char* key;    // PET_ variable suffix and map key
    const char* help;
  };
  const Spec options[] = {
      {"--nnodes", "nnodes", "Number of nodes, N or MIN:MAX (default 1:1)"},
      {"--nproc_per_node,--nproc-per-node", "nproc_per_node",
       "Workers per node: N, cpu, gpu or auto (default 1)"},
      {"--rdzv_backend,--rdzv-backend", "rdzv_backend",
       "static, c10d, ctrund, etcd or etcd-v2 (default static)"},
      {"--rdzv_endpoint,--rdzv-endpoint", "rdzv_endpoint",
       "HOST[:PORT] of ctrund (port 29400), or etcd endpoints H1[:PORT],H2... (port 2379)"},
      {"--rdzv_id,--rdzv-id", "rdzv_id", "Job id shared by every node (default none)"},
      {"--rdzv_conf,--rdzv-conf", "rdzv_conf",
       "key=value,... (join_timeout, last_call_timeout, "
       "close_timeout, keep_alive_interval, "
       "keep_alive_max_attempt, is_host, token_file)"},
      {"--max_restarts,--max-restarts", "max_restarts", "Restarts of the job before failing (0)"},
      {"--monitor_interval,--monitor-interval", "monitor_interval",
       "Accepted for torchrun compatibility; exits are seen at once"},
      {"--start_method,--start-method", "start_method", "Accepted for compatibility (spawn)"},
      {"--role", "role", "Role of the workers (default default)"},
      {"--log_dir,--log-dir", "log_dir", "Base directory of per-rank logs and error files"},
      {"-r,--redirects", "redirects", "Streams to files only: 0-3 or 0:1,1:2"},
      {"-t,--tee", "tee", "Streams to files and console: 0-3 or 0:1,1:2"},
      {"--local_ranks_filter,--local-ranks-filter", "local_ranks_filter",
       "Local ranks whose output reaches the console, e.g. 0,2"},
      {"--node_rank,--node-rank", "node_rank", "Rank of this node (static rendezvous)"},
      {"--master_addr,--master-addr", "master_addr", "Address of node rank 0 (static)"},
      {"--master_port,--master-port", "master_port", "Port on node rank 0 (static, 29500)"},
      {"--local_addr,--local-addr", "local_addr", "Address other nodes reach this one at"},
      {"--signals_to_handle,--signals-to-handle", "signals_to_handle",
       "Signals forwarded to workers (SIGTERM,SIGINT,SIGHUP,SIGQUIT)"},
      {"--shutdown_timeout,--shutdown-timeout", "shutdown_timeout",
       "Seconds between the signal and SIGKILL when stopping workers (30)"},
      {"--worker_timeout,--worker-timeout", "worker_timeout",
       "Kill a worker whose heartbeat stops for this many seconds and restart the job "
       "(0: off, the default)"},
      {"--event_log,--event-log", "event_log",
       "Append the agent's events (join, round, worker exit, restart, job end) to this file as "
       "JSON lines"},
  };
  for (const auto& o : options) {
    auto* opt = app.add_option(o.names, values[o.key], o.help);
    std::string pet = std::string("PET_") + o.key;
    std::transform(pet.begin(), pet.end(), pet.begin(), ::toupper);
    // The variable is the value unless the flag is given (CLI11 then overwrites it).
    if (auto v = env(pet)) values[o.key] = *v;
    (void)opt;
  }
  const Spec switches[] = {
      {"--standalone", "standalone", "Host a rendezvous on a free local port; random run id"},
      {"-m,--module", "module", "Run the entrypoint as a Python module (python -m)"},
      {"--no_python,--no-python", "no_python", "Execute the entrypoint directly, not with Python"},
      {"--run_path,--run-path", "run_path", "Run the script with runpy.run_path"},
      {"--slurm", "slurm",
       "Inside a Slurm step: take the node count, node rank, rendezvous host, run id and GPU "
       "count from SLURM_* variables"},
  };
  for (const auto& s : switches) {
    app.add_flag(s.names, flags[s.key], s.help);
    std::string pet = std::string("PET_") + s.key;
    std::transform(pet.begin(), pet.end(), pet.begin(), ::toupper);
    if (auto v = env(pet)) {
      auto n = to_int(trim(*v));
      if (!n || (*n != 0 && *n != 1)) return bad(pet + ": expected 0 or 1, got '" + *v + "'");
      flags[s.key] = *n == 1;
    }
  }

  Parsed parsed;
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 2.1 wants them reversed
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    parsed.outcome = ParseOutcome::kHelp;
    parsed.text = app.help();
    return parsed;
  } catch (const CLI::CallForVersion& e) {
    parsed.outcome = ParseOutcome::kVersion;
    parsed.text = std::string("ctrun ") + CTRUN_VERSION + "\n";
    return parsed;
  } catch (const CLI::ParseError& e) {
    return bad(e.what());
  }

  LaunchOptions& o = parsed.options;
  std::vector<std::string> rest = app.remaining();
  if (rest.empty())
    return bad("missing the training program: ctrun [options] ENTRYPOINT [args...]");
  if (rest.front().size() > 1 && rest.front()[0] == '-') {
    return bad("unknown option '" + rest.front() + "' (see ctrun --help)");
  }
  o.entrypoint = rest.front();
  o.script_args.assign(rest.begin() + 1, rest.end());
  o.standalone = flags["standalone"];
  o.module = flags["module"];
  o.no_python = flags["no_python"];
  o.run_path = flags["run_path"];
  if (o.module && o.no_python) return bad("--module and --no_python cannot be used together");

  auto value = [&](const char* key) -> const std::string& { return values[key]; };
  auto int_flag = [&](const char* key, const char* flag, long long lo, long long hi,
                      int& out) -> rendezvous::Status {
    if (value(key).empty()) return rendezvous::ok_status();
    auto v = to_int(trim(value(key)));
    if (!v || *v < lo || *v > hi) {
      return bad(std::string(flag) + ": expected an integer in " + std::to_string(lo) + ".." +
                 std::to_string(hi) + ", got '" + value(key) + "'");
    }
    out = static_cast<int>(*v);
    return rendezvous::ok_status();
  };
  auto seconds_flag = [&](const char* key, const char* flag, bool positive,
                          double& out) -> rendezvous::Status {
    if (value(key).empty()) return rendezvous::ok_status();
    auto v = to_number(trim(value(key)));
    if (!v || *v < 0 || (positive && *v == 0)) {
      return bad(std::string(flag) + ": expected a " + (positive ? "positive" : "non-negative") +
                 " number of seconds, got '" + value(key) + "'");
    }
    out = *v;
    return rendezvous::ok_status();
  };

  if (!value("nnodes").empty()) {
    const std::string n = trim(value("nnodes"));
    auto parts = split(n, ':');
    std::optional<long long> lo, hi;
    if (parts.size() == 1) {
      lo = hi = to_int(parts[0]);
    } else if (parts.size() == 2) {
      lo = to_int(parts[0]);
      hi = to_int(parts[1]);
    }
    if (!lo || !hi || *lo < 1 || *hi < *lo || *hi > (1 << 18)) {
      return bad("--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got '" + n + "'");
    }
    o.min_nodes = static_cast<int>(*lo);
    o.max_nodes = static_cast<int>(*hi);
  }
  if (!value("nproc_per_node").empty()) {
    o.nproc_per_node = trim(value("nproc_per_node"));
    const auto n = to_int(o.nproc_per_node);
    const bool word =
        o.nproc_per_node == "cpu" || o.nproc_per_node == "gpu" || o.nproc_per_node == "auto";
    if (!word && (!n || *n < 1 || *n > kMaxWorkersPerNode)) {
      return bad("--nproc_per_node: expected a positive integer, cpu, gpu or auto, got '" +
                 o.nproc_per_node + "'");
    }
  }
  if (!value("rdzv_backend").empty()) {
    o.rdzv_backend = trim(value("rdzv_backend"));
    if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d" && o.rdzv_backend != "ctrund" &&
        o.rdzv_backend != "etcd" && o.rdzv_backend != "etcd-v2") {
      return bad("--rdzv_backend: expected static, c10d, ctrund, etcd or etcd-v2, got '" +
                 o.rdzv_backend + "'");
    }
  }
  o.rdzv_endpoint = trim(value("rdzv_endpoint"));
  if (!value("rdzv_id").empty()) o.rdzv_id = value("rdzv_id");
  auto conf = parse_rdzv_conf(value("rdzv_conf"));
  if (!conf) return conf.error();
  o.rdzv_conf = conf.value();
  if (auto s = int_flag("max_restarts", "--max_restarts", 0, 1 << 20, o.max_restarts); !s)
    return s.error();
  if (auto s = seconds_flag("monitor_interval", "--monitor_interval", true, o.monitor_interval);
      !s) {
    return s.error();
  }
  if (!value("start_method").empty()) {
    o.start_method = trim(value("start_method"));
    if (o.start_method != "spawn" && o.start_method != "fork" && o.start_method != "forkserver") {
      return bad("--start_method: expected spawn, fork or forkserver, got '" + o.start_method +
                 "'");
    }
  }
  if (!value("role").empty()) o.role = value("role");
  o.log_dir = value("log_dir");
  if (!value("redirects").empty()) {
    auto r = parse_std_spec(value("redirects"), "--redirects");
    if (!r) return r.error();
    o.redirects = r.value();
  }
  if (!value("tee").empty()) {
    auto t = parse_std_spec(value("tee"), "--tee");
    if (!t) return t.error();
    o.tee = t.value();
  }
  if (!trim(value("local_ranks_filter")).empty()) {
    for (const auto& item : split(value("local_ranks_filter"), ',')) {
      auto r = to_int(trim(item));
      if (!r || *r < 0) {
        return bad("--local_ranks_filter: expected local ranks like 0,2, got '" +
                   value("local_ranks_filter") + "'");
      }
      o.local_ranks_filter.push_back(static_cast<int>(*r));
    }
  }
  o.node_rank_given = !value("node_rank").empty();
  if (auto s = int_flag("node_rank", "--node_rank", 0, (1 << 18) - 1, o.node_rank); !s)
    return s.error();
  if (!value("master_addr").empty()) o.master_addr = trim(value("master_addr"));
  if (auto s = int_flag("master_port", "--master_port", 0, 65535, o.master_port); !s)
    return s.error();
  o.local_addr = trim(value("local_addr"));
  const std::string signals = value("signals_to_handle").empty() ? "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
                                                                 : value("signals_to_handle");
  for (const auto& name : split(signals, ',')) {
    auto signo = signal_from_name(trim(name));
    if (!signo || *signo == SIGKILL) {
      return bad("--signals_to_handle: '" + trim(name) + "' is not a signal that can be handled");
    }
    o.signals_to_handle.push_back(*signo);
  }
  if (auto s = seconds_flag("shutdown_timeout", "--shutdown_timeout", false, o.shutdown_timeout);
      !s) {
    return s.error();
  }
  o.event_log = value("event_log");
  if (auto s = seconds_flag("worker_timeout", "--worker_timeout", false, o.worker_timeout); !s) {
    return s.error();
  }
  if (flags["slurm"]) {
    if (o.standalone) return bad("--slurm and --standalone cannot be used together");
    auto facts = read_slurm_environment(env);
    if (!facts) return facts.error();
    ExplicitOptions given;
    given.nnodes = !value("nnodes").empty();
    given.node_rank = o.node_rank_given;
    given.nproc_per_node = !value("nproc_per_node").empty();
    given.rdzv_backend = !value("rdzv_backend").empty();
    given.rdzv_endpoint = !o.rdzv_endpoint.empty();
    given.rdzv_id = !value("rdzv_id").empty();
    given.master_addr = !value("master_addr").empty();
    given.master_port = !value("master_port").empty();
    if (auto s = apply_slurm(facts.value(), given, o); !s) return s.error();
  }
  if (o.node_rank >= o.max_nodes) {
    return bad("--node_rank: " + std::to_string(o.node_rank) +
               " is not below the number of nodes (" + std::to_string(o.max_nodes) + ")");
  }
  return parsed;
}

MachineFacts probe_machine(const EnvLookup& env) {
  MachineFacts facts;
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  facts.cpu_count = cpus > 0 ? static_cast<int>(cpus) : 1;
  int devices = 0;
  if (DIR* dev = opendir("/dev")) {
    while (dirent* e = readdir(dev)) {
      const char* name = e->d_name;
      if (std::strncmp(name, "nvidia", 6) == 0 && name[6] >= '0' && name[6] <= '9') ++devices;
    }
    closedir(dev);
  }
  facts.gpu_count = devices;
  if (auto visible = env("CUDA_VISIBLE_DEVICES")) {
    facts.gpu_count = std::min(count_visible_devices(*visible), devices);
  }
  return facts;
}

int count_visible_devices(const std::string& cuda_visible_devices) {
  int listed = 0;
  for (const auto& item : split(cuda_visible_devices, ',')) {
    if (trim(item).empty() || trim(item) == "-1") break;
    ++listed;
  }
  return listed;
}

Result<int> resolve_nproc(const std::string& nproc_per_node, const MachineFacts& machine) {
  if (nproc_per_node == "cpu") return machine.cpu_count;
  if (nproc_per_node == "gpu") {
    if (machine.gpu_count == 0) {
      return bad(
          "--nproc_per_node=gpu: no NVIDIA GPU is visible (no /dev/nvidiaN, or "
          "CUDA_VISIBLE_DEVICES hides them all)");
    }
    return machine.gpu_count;
  }
  if (nproc_per_node == "auto")
    return machine.gpu_count > 0 ? machine.gpu_count : machine.cpu_count;
  auto n = to_int(nproc_per_node);
  if (!n || *n < 1) return bad("--nproc_per_node: '" + nproc_per_node + "' is not a worker count");
  return static_cast<int>(*n);
}

}  // namespace ctrun::launcher
