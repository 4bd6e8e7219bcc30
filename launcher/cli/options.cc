#include "ctrun/launcher/options.h"

#include <dirent.h>
#include <unistd.h>
#include <csignal>
#include <cstdlib>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <set>
#include <sstream>
#include <tuple>

#include "ctrun/launcher/slurm.h"
#include "launcher/cli/arg_parser.h"
#include "launcher/cli/option_text.h"
#include "rendezvous/base/version.h"

namespace ctrun::launcher {
namespace {

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

// Python's str.replace: every non-overlapping `from`, left to right.
std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t start = 0;
  for (std::size_t at; (at = text.find(from, start)) != std::string::npos;
       start = at + from.size()) {
    out.append(text, start, at - start);
    out += to;
  }
  out.append(text, start, std::string::npos);
  return out;
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

std::optional<std::uint16_t> health_check_port(std::string_view value) {
  const auto port = python_int(std::string(value));  // what torch's int() takes
  if (!port || *port < 1 || *port > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(*port);
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

std::vector<std::string> parse_comma_separated_list(const std::string& text) {
  const std::string placeholder = "<COMMA_PLACEHOLDER>";
  std::vector<std::string> items;
  // split() drops a last empty item; the extra comma makes it str.split(","), which keeps it.
  for (const auto& item : split(replace_all(text, ",,", placeholder) + ",", ',')) {
    items.push_back(replace_all(item, placeholder, ","));
  }
  return items;
}

Result<RendezvousConf> parse_rdzv_conf(const std::string& text) {
  RendezvousConf conf;
  if (trim(text).empty()) return conf;
  bool join_timeout_given = false;
  std::optional<double> timeout_alias;
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
    if (key == "timeout") {
      // Only torch's etcd-v1 handler reads it (its join timeout); c10d and static ignore it,
      // whatever it holds (torch's own launcher test passes "timeout=5'"). So: a number is the
      // join timeout unless join_timeout says otherwise, anything else is ignored.
      auto v = to_number(value);
      if (v && *v > 0) {
        timeout_alias = *v;
      } else {
        conf.ignored_keys.push_back(key);
      }
    } else if (key == "join_timeout") {
      join_timeout_given = true;
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
    } else if (key == "max_connections" || key == "max_connections_per_host" ||
               key == "worker_store_max_connections") {
      auto v = to_int(value);
      if (!v || *v < 1) {
        return bad("--rdzv_conf: " + key + " must be a positive integer, got '" + value + "'");
      }
      (key == "max_connections"            ? conf.max_connections
       : key == "max_connections_per_host" ? conf.max_connections_per_host
                                           : conf.worker_store_max_connections) =
          static_cast<std::size_t>(*v);
    } else if (key == "token_file") {
      if (value.empty()) return bad("--rdzv_conf: token_file is empty");
      conf.token_file = value;
    } else if (key == "protocol") {
      // torch's etcd-v2 handler lowercases it; its etcd handler does not (ours does).
      std::string v = value;
      std::transform(v.begin(), v.end(), v.begin(), ::tolower);
      if (v != "http" && v != "https" && v != "tcp" && v != "tls") {
        return bad(
            "--rdzv_conf: protocol must be http or https (etcd), tcp or tls (ctrund), got '" +
            value + "'");
      }
      conf.protocol = v;
    } else if (key == "cacert" || key == "cert" || key == "key" || key == "ca_cert" ||
               key == "ssl_cert" || key == "ssl_cert_key" || key == "user" ||
               key == "password_file") {
      // torch's etcd handler names them cacert, cert and key; its etcd-v2 handler ca_cert,
      // ssl_cert and ssl_cert_key: either works with either backend.
      if (value.empty()) return bad("--rdzv_conf: " + key + " is empty");
      (key == "cacert" || key == "ca_cert"     ? conf.cacert
       : key == "cert" || key == "ssl_cert"    ? conf.cert
       : key == "key" || key == "ssl_cert_key" ? conf.key
       : key == "user"                         ? conf.user
                                               : conf.password_file) = value;
    } else {
      conf.ignored_keys.push_back(key);
    }
  }
  if (timeout_alias && !join_timeout_given) conf.join_timeout = *timeout_alias;
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

namespace {

ArgSpec value_option(std::vector<std::string> names, std::string dest, std::string help,
                     EnvDefault env = EnvDefault::kPetVariable) {
  return ArgSpec{std::move(names), std::move(dest), ArgKind::kValue, env, std::move(help)};
}

ArgSpec flag_option(std::vector<std::string> names, std::string dest, std::string help,
                    EnvDefault env = EnvDefault::kPetVariable) {
  return ArgSpec{std::move(names), std::move(dest), ArgKind::kFlag, env, std::move(help)};
}

ArgSpec exit_option(std::vector<std::string> names, std::string dest, std::string help) {
  return ArgSpec{std::move(names), std::move(dest), ArgKind::kExit, EnvDefault::kNone,
                 std::move(help)};
}

// An option that only its full name selects (ArgSpec::abbreviable).
ArgSpec exact(ArgSpec spec) {
  spec.abbreviable = false;
  return spec;
}

// torchrun's options (torch/distributed/run.py on PyTorch main) in its order, which is the
// order argparse lists them in an "ambiguous option" error, then ctrun's own. docs/env.md has
// the table of what each does here.
const std::vector<ArgSpec>& launch_option_table() {
  static const std::vector<ArgSpec> table = {
      exit_option({"-h", "--help"}, "help", "Print this help and exit"),
      value_option({"--nnodes"}, "nnodes", "Number of nodes, N or MIN:MAX (default 1:1)"),
      value_option({"--nproc-per-node", "--nproc_per_node"}, "nproc_per_node",
                   "Workers per node: N, cpu, gpu or auto (default 1)"),
      value_option({"--rdzv-backend", "--rdzv_backend"}, "rdzv_backend",
                   "static, c10d, ctrund, etcd or etcd-v2 (default static)"),
      value_option({"--rdzv-endpoint", "--rdzv_endpoint"}, "rdzv_endpoint",
                   "HOST[:PORT] of the rendezvous (c10d/ctrund: port 29400; PORT 0 on one node: "
                   "a free port), or etcd endpoints H1[:PORT],H2... (port 2379)"),
      value_option({"--rdzv-id", "--rdzv_id"}, "rdzv_id", "Job id shared by every node"),
      value_option({"--rdzv-conf", "--rdzv_conf"}, "rdzv_conf",
                   "key=value,... (join_timeout, last_call_timeout, close_timeout, "
                   "keep_alive_interval, keep_alive_max_attempt, is_host, token_file; TLS: "
                   "protocol, cacert, cert, key; etcd's user: user, password_file)"),
      flag_option({"--standalone"}, "standalone",
                  "Host a rendezvous on a free local port; random run id"),
      value_option({"--max-restarts", "--max_restarts"}, "max_restarts",
                   "Restarts of the job before failing (0)"),
      value_option({"--monitor-interval", "--monitor_interval"}, "monitor_interval",
                   "Seconds the other workers get to fail too after a failure, so ranks "
                   "that fail together are all reported (0.1); exits are seen at once"),
      value_option({"--start-method", "--start_method"}, "start_method",
                   "spawn, fork or forkserver: accepted; workers are always new processes"),
      value_option({"--event-log-handler", "--event_log_handler"}, "event_log_handler",
                   "null (default), dynamic_rendezvous, or console: the agent's events to stderr"),
      value_option({"--role"}, "role", "Role of the workers (default default)"),
      flag_option({"-m", "--module"}, "module",
                  "Run the entrypoint as a Python module (python -m)"),
      flag_option({"--no-python", "--no_python"}, "no_python",
                  "Execute the entrypoint directly, not with Python"),
      flag_option({"--run-path", "--run_path"}, "run_path",
                  "Run the script with Python (torchrun: runpy.run_path)"),
      value_option({"--log-dir", "--log_dir"}, "log_dir",
                   "Base directory of per-rank logs and error files"),
      value_option({"-r", "--redirects"}, "redirects", "Streams to files only: 0-3 or 0:1,1:2"),
      value_option({"-t", "--tee"}, "tee", "Streams to files and console: 0-3 or 0:1,1:2"),
      value_option({"--local-ranks-filter", "--local_ranks_filter"}, "local_ranks_filter",
                   "Local ranks whose output reaches the console, e.g. 0,2"),
      value_option({"--duplicate-stdout-filters", "--duplicate_stdout_filters"},
                   "duplicate_stdout_filters",
                   "Also write the workers' stdout console lines that contain one of these texts "
                   "(a,b; ,, is a comma) to attempt_N/filtered_stdout.log under the log dir"),
      value_option({"--duplicate-stderr-filters", "--duplicate_stderr_filters"},
                   "duplicate_stderr_filters",
                   "Also write the workers' stderr console lines that contain one of these texts "
                   "(a,b; ,, is a comma) to attempt_N/filtered_stderr.log under the log dir"),
      value_option({"--node-rank", "--node_rank"}, "node_rank",
                   "Rank of this node (static rendezvous)"),
      value_option({"--master-addr", "--master_addr"}, "master_addr",
                   "Address of node rank 0 (static)"),
      value_option({"--master-port", "--master_port"}, "master_port",
                   "Port on node rank 0 (static, 29500)"),
      value_option({"--local-addr", "--local_addr"}, "local_addr",
                   "Address other nodes reach this one at"),
      value_option({"--logs-specs", "--logs_specs"}, "logs_specs",
                   "default only (torch's DefaultLogsSpecs layout)", EnvDefault::kNone),
      value_option({"--numa-binding", "--numa_binding"}, "numa_binding",
                   "node, socket, exclusive or core-complex: bind each worker to CPUs (and "
                   "prefer the memory) near its GPU, or spread over NUMA nodes without GPUs",
                   EnvDefault::kNone),
      value_option({"--signals-to-handle", "--signals_to_handle"}, "signals_to_handle",
                   "Signals forwarded to workers (SIGTERM,SIGINT,SIGHUP,SIGQUIT)"),
      value_option({"--shutdown-timeout", "--shutdown_timeout"}, "shutdown_timeout",
                   "Seconds between the signal and SIGKILL when stopping workers "
                   "(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)"),
      flag_option({"--virtual-local-rank", "--virtual_local_rank"}, "virtual_local_rank",
                  "LOCAL_RANK=0 for every worker, CUDA_VISIBLE_DEVICES narrowed to its GPU"),
      // ctrun's own.
      value_option({"--worker-timeout", "--worker_timeout"}, "worker_timeout",
                   "Kill a worker whose heartbeat stops for this many seconds and restart the "
                   "job (0: off, the default)"),
      // Not abbreviable: torchrun's own abbreviations (--st) must stay as argparse reads them.
      exact(value_option({"--straggler-factor", "--straggler_factor"}, "straggler_factor",
                         "Name a rank whose own time per step (its step less its waits for "
                         "the others) is this many times the job's median a straggler (default "
                         "2 where workers have heartbeat files; 0: off)")),
      exact(value_option({"--straggler-window", "--straggler_window"}, "straggler_window",
                         "The number of steps a rank's step time is measured over (default 50)")),
      exact(value_option({"--straggler-interval", "--straggler_interval"}, "straggler_interval",
                         "Seconds within which the agents report step rates and judge them "
                         "twice (default 5)")),
      exact(value_option({"--health-check", "--health_check"}, "health_check",
                         "Before each join, run this shell command: exit 0 = healthy, else the "
                         "node checks again instead of joining")),
      exact(value_option({"--health-check-interval", "--health_check_interval"},
                         "health_check_interval",
                         "Seconds between the checks of an unhealthy node (default 30)")),
      exact(value_option({"--health-check-timeout", "--health_check_timeout"},
                         "health_check_timeout",
                         "Seconds the --health_check command may take (default 60)")),
      exact(value_option({"--health-min-free-mib", "--health_min_free_mib"}, "health_min_free_mib",
                         "Free MiB the log directory and --health_check_dirs need to be healthy "
                         "(default 100; 0: not checked)")),
      exact(value_option({"--health-check-dirs", "--health_check_dirs"}, "health_check_dirs",
                         "More directories whose free space is checked (the checkpoints'), "
                         "comma-separated")),
      exact(value_option({"--hang-report-timeout", "--hang_report_timeout"}, "hang_report_timeout",
                         "When --worker_timeout finds a hung worker, the seconds the job's "
                         "agents have to take every rank's stacks for one report before it is "
                         "killed (default 15; 0: no report)")),
      exact(flag_option({"--flight-recorder", "--flight_recorder"}, "flight_recorder",
                        "Switch on the NCCL Flight Recorder of the workers' torch (2.x) and read "
                        "its dumps into hang reports",
                        EnvDefault::kNone)),
      value_option({"--fault-tolerance", "--fault_tolerance"}, "fault_tolerance",
                   "none (the default: a failure restarts every worker) or step: replace a "
                   "failed worker alone and stop nobody for a membership change"),
      value_option({"--event-log", "--event_log"}, "event_log",
                   "Append the agent's events (join, round, worker exit, restart, job end) to "
                   "this file as JSON lines"),
      flag_option({"--slurm"}, "slurm",
                  "Inside a Slurm step: take the node count, node rank, rendezvous host, run id "
                  "and GPU count from SLURM_* variables"),
      exact(flag_option({"--stop-on-stdin-close", "--stop_on_stdin_close"}, "stop_on_stdin_close",
                        "Stop the job on this node, as on SIGTERM, when standard input ends (how "
                        "--hostfile stops each host's agent)",
                        EnvDefault::kNone)),
      exact(value_option({"--faults"}, "faults",
                         "Inject faults into the workers: a JSON plan file, an inline plan "
                         "(kill:rank=3,after=20;hang:...), or random:seed=S,ranks=A-B,window=A-B",
                         EnvDefault::kNone)),
      exact(value_option({"--fault-report", "--fault_report"}, "fault_report",
                         "With --faults: write what became of each fault injected on this node "
                         "(JSON: when seen, when running again, steps redone) to this file",
                         EnvDefault::kNone)),
      // The launcher of a whole cluster over ssh (docs/cluster.md).
      exact(value_option({"--hostfile"}, "hostfile",
                         "Launch on every host of FILE over ssh ('HOST slots=N' lines, # comments)",
                         EnvDefault::kNone)),
      exact(value_option({"--hosts"}, "hosts", "Launch on these hosts over ssh: HOST[:SLOTS],...",
                         EnvDefault::kNone)),
      exact(value_option({"--include"}, "include",
                         "Only these hosts, or slots of a host: HOST[:SLOT,...]@HOST...",
                         EnvDefault::kNone)),
      exact(value_option({"--exclude"}, "exclude",
                         "Leave out these hosts, or slots of a host: HOST[:SLOT,...]@HOST...",
                         EnvDefault::kNone)),
      exact(value_option({"--ssh"}, "ssh", "The ssh command for --hostfile (default ssh)",
                         EnvDefault::kNone)),
      exact(value_option({"--ssh-port", "--ssh_port"}, "ssh_port", "The hosts' ssh port",
                         EnvDefault::kNone)),
      exact(value_option({"--forward-env", "--forward_env"}, "forward_env",
                         "More variables to send to the hosts: NAME or PREFIX*, comma-separated",
                         EnvDefault::kNone)),
      exact(
          value_option({"--env-file", "--env_file"}, "env_file",
                       "NAME=VALUE lines to set on every host (default ./.ctrun_env, ~/.ctrun_env)",
                       EnvDefault::kNone)),
      exact(flag_option({"--dry-run", "--dry_run"}, "dry_run",
                        "With --hostfile: print each host's command and exit", EnvDefault::kNone)),
      exact(value_option({"--remote-ctrun", "--remote_ctrun"}, "remote_ctrun",
                         "ctrun's path on the hosts (default: this ctrun's path)",
                         EnvDefault::kNone)),
      exit_option({"--version"}, "version", "Print ctrun's version and exit"),
  };
  return table;
}

std::string help_text(const std::vector<ArgSpec>& table) {
  std::string text =
      "usage: ctrun [options] ENTRYPOINT [args...]\n\n"
      "ctrun: a torchrun-compatible elastic launcher for distributed training.\n"
      "Every option also comes from PET_<NAME> (e.g. PET_NPROC_PER_NODE); long options may be\n"
      "abbreviated to any unambiguous prefix, as with torchrun.\n\noptions:\n";
  for (const auto& spec : table) {
    std::string names;
    for (const auto& n : spec.names) names += (names.empty() ? "" : ", ") + n;
    if (spec.kind == ArgKind::kValue) {
      std::string metavar = spec.dest;
      std::transform(metavar.begin(), metavar.end(), metavar.begin(), ::toupper);
      names += " " + metavar;
    }
    text += "  " + names + "\n      " + spec.help + "\n";
  }
  return text;
}

// How a value is named in an error: the flag, and the variable it came from if it did.
std::string source_label(const ArgValue& value, const std::string& flag) {
  return value.from_env ? value.source + " (" + flag + ")" : flag;
}

// Whether an endpoint names its port ("host:1", "[::1]:1"), not only its host.
bool endpoint_has_port(const std::string& endpoint) {
  const std::string t = trim(endpoint);
  if (!t.empty() && t.front() == '[') return t.find("]:") != std::string::npos;
  return std::count(t.begin(), t.end(), ':') == 1;
}

// The options only the launcher of --hostfile reads, and the ones it sets for each host's
// agent itself: none of them is passed on as given.
bool launcher_sets(const std::string& dest) {
  static const std::set<std::string> dests = {
      "hostfile",     "hosts",         "include", "exclude",      "ssh",     "ssh_port",
      "forward_env",  "env_file",      "dry_run", "remote_ctrun", "nnodes",  "nproc_per_node",
      "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",    "log_dir", "stop_on_stdin_close",
      "standalone"};
  return dests.count(dest) > 0;
}

// The command line a host's agent gets for everything the launcher does not set: each option
// given (on the command line or as its PET_ variable, which the hosts do not have) in one
// spelling, --name=value, then the entrypoint and its arguments.
std::vector<std::string> agent_command_line(const std::vector<ArgSpec>& table,
                                            const ParsedArgs& a) {
  std::vector<std::string> out;
  for (const auto& spec : table) {
    if (launcher_sets(spec.dest)) continue;
    std::string name;
    for (const auto& n : spec.names) {
      if (n.rfind("--", 0) == 0) name = n;  // the last long spelling: torchrun's underscore one
    }
    if (spec.kind == ArgKind::kFlag && a.flags.count(spec.dest) > 0) out.push_back(name);
    if (spec.kind != ArgKind::kValue) continue;
    if (auto it = a.values.find(spec.dest); it != a.values.end()) {
      out.push_back(name + "=" + it->second.text);
    }
  }
  out.push_back(*a.script);
  out.insert(out.end(), a.script_args.begin(), a.script_args.end());
  return out;
}

// A --forward_env item: a variable name, or a prefix of names ending in '*'.
bool valid_forward_item(const std::string& item) {
  return valid_variable_name(!item.empty() && item.back() == '*' ? item.substr(0, item.size() - 1)
                                                                 : item);
}

// --hostfile / --hosts and what goes with them into o.cluster; the options that make no sense
// with them (this node's rank, a static rendezvous, Slurm) are errors.
rendezvous::Status read_cluster_options(const std::vector<ArgSpec>& table, const ParsedArgs& a,
                                        LaunchOptions& o) {
  auto given = [&](const char* dest) -> const ArgValue* {
    auto it = a.values.find(dest);
    return it == a.values.end() ? nullptr : &it->second;
  };
  const ArgValue* hostfile = given("hostfile");
  const ArgValue* hosts = given("hosts");
  if (!hostfile && !hosts) {
    for (const char* dest :
         {"include", "exclude", "ssh", "ssh_port", "forward_env", "env_file", "remote_ctrun"}) {
      if (given(dest)) return bad(std::string("--") + dest + " goes with --hostfile or --hosts");
    }
    if (a.flags.count("dry_run") > 0) return bad("--dry_run goes with --hostfile or --hosts");
    return rendezvous::ok_status();
  }
  if (hostfile && hosts) return bad("--hostfile and --hosts cannot be used together");
  const std::string with = hostfile ? "--hostfile" : "--hosts";
  if (o.standalone) return bad("--standalone and " + with + " cannot be used together");
  if (a.flags.count("slurm") > 0) {
    return bad("--slurm and " + with +
               " cannot be used together (under Slurm, srun starts the "
               "agents)");
  }
  if (o.stop_on_stdin_close)
    return bad("--stop_on_stdin_close is for the agents " + with + " starts");
  for (const char* dest : {"node_rank", "master_addr", "master_port"}) {
    if (given(dest)) {
      return bad(std::string("--") + dest + ": with " + with +
                 " the rendezvous assigns node ranks (leave it out)");
    }
  }
  ClusterOptions c;
  if (hostfile) c.hostfile = hostfile->text;
  if (hosts) c.hosts = hosts->text;
  if (const ArgValue* v = given("include")) c.include = v->text;
  if (const ArgValue* v = given("exclude")) c.exclude = v->text;
  if (const ArgValue* v = given("ssh")) {
    if (trim(v->text).empty()) return bad("--ssh: expected an ssh command, got ''");
    c.ssh = v->text;
  }
  if (const ArgValue* v = given("ssh_port")) {
    auto n = python_int(v->text);
    if (!n || *n < 1 || *n > 65535) {
      return bad("--ssh_port: expected a port in 1..65535, got '" + v->text + "'");
    }
    c.ssh_port = static_cast<int>(*n);
  }
  if (const ArgValue* v = given("forward_env")) {
    for (const auto& item : split(v->text, ',')) {
      if (!valid_forward_item(trim(item))) {
        return bad("--forward_env: expected variable names or prefixes like NCCL_*, got '" +
                   v->text + "'");
      }
      c.forward_env.push_back(trim(item));
    }
  }
  if (const ArgValue* v = given("env_file")) {
    if (v->text.empty()) return bad("--env_file: expected a file, got ''");
    c.env_file = v->text;
  }
  c.dry_run = a.flags.count("dry_run") > 0;
  if (const ArgValue* v = given("remote_ctrun")) c.remote_ctrun = v->text;
  c.nnodes_given = given("nnodes") != nullptr;
  c.nproc_given = given("nproc_per_node") != nullptr;
  c.rdzv_id_given = given("rdzv_id") != nullptr;
  c.rdzv_endpoint_given = !o.rdzv_endpoint.empty();
  if (const ArgValue* v = given("rdzv_conf")) c.rdzv_conf = v->text;
  if (o.rdzv_conf.is_host.value_or(false)) {
    return bad("--rdzv_conf: is_host=true: with " + with +
               " the launcher hosts the rendezvous, never a host's agent");
  }
  if (!given("rdzv_backend")) o.rdzv_backend = "c10d";
  if (o.rdzv_backend == "static") {
    return bad("--rdzv_backend=static: with " + with +
               " the rendezvous is c10d (the default: the launcher hosts it), ctrund or etcd");
  }
  if (o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2") {
    if (o.rdzv_endpoint.empty()) {
      return bad("--rdzv_backend=" + o.rdzv_backend +
                 " needs --rdzv_endpoint (the etcd "
                 "endpoints every host reaches)");
    }
  } else if (!o.rdzv_endpoint.empty()) {
    auto ep = parse_rdzv_endpoint(o.rdzv_endpoint, rendezvous::kDefaultPort);
    if (!ep) return ep.error();
    if (ep.value().port == 0) {
      return bad(
          "--rdzv_endpoint: port 0 works on one node only; give the port the hosts "
          "connect to");
    }
  }
  c.agent_args = agent_command_line(table, a);
  o.cluster = std::move(c);
  return rendezvous::ok_status();
}

}  // namespace

Result<Endpoint> parse_rdzv_endpoint(const std::string& text, std::uint16_t default_port) {
  const std::string t = trim(text);
  const bool free_port =
      endpoint_has_port(t) && t.size() > 2 && t.compare(t.size() - 2, 2, ":0") == 0;
  if (!free_port) return parse_endpoint(t, default_port);
  auto host = parse_endpoint(t.substr(0, t.size() - 2), default_port);
  if (!host) return host.error();
  return Endpoint{host.value().host, 0};
}

Result<Parsed> parse_launch_options(const std::vector<std::string>& args, const EnvLookup& env) {
  const auto& table = launch_option_table();
  auto read = parse_args(table, args, env);
  if (!read) return read.error();
  const ParsedArgs& a = read.value();

  Parsed parsed;
  if (a.exit_dest == "help") {
    parsed.outcome = ParseOutcome::kHelp;
    parsed.text = help_text(table);
    return parsed;
  }
  if (a.exit_dest == "version") {
    parsed.outcome = ParseOutcome::kVersion;
    parsed.text = "ctrun " + version_text() + "\n";
    return parsed;
  }

  LaunchOptions& o = parsed.options;
  if (!a.script) return bad("missing the training program: ctrun [options] ENTRYPOINT [args...]");
  o.entrypoint = *a.script;
  o.script_args = a.script_args;
  auto flag = [&](const char* dest) { return a.flags.count(dest) > 0; };
  o.standalone = flag("standalone");
  o.module = flag("module");
  o.no_python = flag("no_python");
  o.run_path = flag("run_path");
  o.virtual_local_rank = flag("virtual_local_rank");
  if (o.module && o.no_python) return bad("--module and --no_python cannot be used together");

  // The value given for `dest` (command line, else its PET_ variable), or nothing.
  auto given = [&](const char* dest) -> const ArgValue* {
    auto it = a.values.find(dest);
    return it == a.values.end() ? nullptr : &it->second;
  };
  // An integer as Python's int() reads it, in [lo, hi].
  auto int_option = [&](const char* dest, const char* flag_name, long long lo, long long hi,
                        int& out) -> rendezvous::Status {
    const ArgValue* v = given(dest);
    if (!v) return rendezvous::ok_status();
    auto n = python_int(v->text);
    if (!n || *n < lo || *n > hi) {
      return bad(source_label(*v, flag_name) + ": expected an integer in " + std::to_string(lo) +
                 ".." + std::to_string(hi) + ", got '" + v->text + "'");
    }
    out = static_cast<int>(*n);
    return rendezvous::ok_status();
  };
  auto seconds_option = [&](const char* dest, const char* flag_name, bool positive,
                            double& out) -> rendezvous::Status {
    const ArgValue* v = given(dest);
    if (!v) return rendezvous::ok_status();
    auto n = to_number(trim(v->text));
    if (!n || *n < 0 || (positive && *n == 0)) {
      return bad(source_label(*v, flag_name) + ": expected a " +
                 (positive ? "positive" : "non-negative") + " number of seconds, got '" + v->text +
                 "'");
    }
    out = *n;
    return rendezvous::ok_status();
  };

  if (const ArgValue* v = given("nnodes")) {
    // torchrun: "N" or "MIN:MAX", each part read by int().
    auto parts = split(v->text, ':');
    if (!v->text.empty() && v->text.back() == ':') parts.emplace_back();
    std::optional<long long> lo, hi;
    if (parts.size() == 1) {
      lo = hi = python_int(parts[0]);
    } else if (parts.size() == 2) {
      lo = python_int(parts[0]);
      hi = python_int(parts[1]);
    }
    if (!lo || !hi || *lo < 1 || *hi < *lo || *hi > (1 << 18)) {
      return bad(source_label(*v, "--nnodes") +
                 ": expected N or MIN:MAX with 1 <= MIN <= MAX, got '" + v->text + "'");
    }
    o.min_nodes = static_cast<int>(*lo);
    o.max_nodes = static_cast<int>(*hi);
  }
  if (const ArgValue* v = given("nproc_per_node")) {
    const std::string& n = v->text;
    if (n == "cpu" || n == "gpu" || n == "auto") {
      o.nproc_per_node = n;
    } else if (auto count = python_int(n); count && *count >= 1 && *count <= kMaxWorkersPerNode) {
      o.nproc_per_node = std::to_string(*count);
    } else if (n == "xpu") {
      return bad(source_label(*v, "--nproc_per_node") +
                 ": xpu is not supported (ctrun counts NVIDIA GPUs: use gpu, auto or a number)");
    } else {
      return bad(source_label(*v, "--nproc_per_node") +
                 ": expected a positive integer, cpu, gpu or auto, got '" + n + "'");
    }
  }
  if (const ArgValue* v = given("rdzv_backend")) {
    o.rdzv_backend = trim(v->text);
    if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d" && o.rdzv_backend != "ctrund" &&
        o.rdzv_backend != "etcd" && o.rdzv_backend != "etcd-v2") {
      return bad(source_label(*v, "--rdzv_backend") +
                 ": expected static, c10d, ctrund, etcd or etcd-v2, got '" + v->text + "'");
    }
  }
  if (const ArgValue* v = given("rdzv_endpoint")) o.rdzv_endpoint = trim(v->text);
  if (const ArgValue* v = given("rdzv_id")) {
    // An empty id is most likely an unset shell variable; "none" would join strangers' jobs.
    if (v->text.empty()) return bad(source_label(*v, "--rdzv_id") + ": expected a job id, got ''");
    o.rdzv_id = v->text;
  }
  if (const ArgValue* v = given("rdzv_conf")) {
    auto conf = parse_rdzv_conf(v->text);
    if (!conf) return conf.error();
    o.rdzv_conf = conf.value();
  }
  if (auto s = int_option("max_restarts", "--max_restarts", 0, 1 << 20, o.max_restarts); !s)
    return s.error();
  if (auto s = seconds_option("monitor_interval", "--monitor_interval", true, o.monitor_interval);
      !s) {
    return s.error();
  }
  if (const ArgValue* v = given("start_method")) {
    o.start_method = trim(v->text);
    if (o.start_method != "spawn" && o.start_method != "fork" && o.start_method != "forkserver") {
      return bad(source_label(*v, "--start_method") +
                 ": expected spawn, fork or forkserver, got '" + v->text + "'");
    }
  }
  if (const ArgValue* v = given("event_log_handler")) {
    // torchrun's registry (torch/distributed/elastic/events/handlers.py).
    o.event_log_handler = v->text;
    if (o.event_log_handler != "null" && o.event_log_handler != "dynamic_rendezvous" &&
        o.event_log_handler != "console") {
      return bad(source_label(*v, "--event_log_handler") +
                 ": expected console, dynamic_rendezvous or null (torchrun's built-in handlers), "
                 "got '" +
                 v->text + "'");
    }
  }
  if (const ArgValue* v = given("role")) o.role = v->text;
  if (const ArgValue* v = given("log_dir")) o.log_dir = v->text;
  if (const ArgValue* v = given("redirects")) {
    auto r = parse_std_spec(v->text, source_label(*v, "--redirects"));
    if (!r) return r.error();
    o.redirects = r.value();
  }
  if (const ArgValue* v = given("tee")) {
    auto t = parse_std_spec(v->text, source_label(*v, "--tee"));
    if (!t) return t.error();
    o.tee = t.value();
  }
  if (const ArgValue* v = given("local_ranks_filter"); v && !v->text.empty()) {
    for (const auto& item : split(v->text + ",", ',')) {
      auto r = python_int(item);
      if (!r || *r < -1 || *r > kMaxWorkersPerNode) {
        return bad(source_label(*v, "--local_ranks_filter") +
                   ": expected local ranks like 0,2, got '" + v->text + "'");
      }
      o.local_ranks_filter.push_back(static_cast<int>(*r));
    }
  }
  // Any text is a list, as with torchrun's type: an empty value is one empty filter, which
  // copies every line.
  if (const ArgValue* v = given("duplicate_stdout_filters")) {
    o.duplicate_stdout_filters = parse_comma_separated_list(v->text);
  }
  if (const ArgValue* v = given("duplicate_stderr_filters")) {
    o.duplicate_stderr_filters = parse_comma_separated_list(v->text);
  }
  o.node_rank_given = given("node_rank") != nullptr;
  if (auto s = int_option("node_rank", "--node_rank", 0, (1 << 18) - 1, o.node_rank); !s)
    return s.error();
  if (const ArgValue* v = given("master_addr")) {
    o.master_addr = trim(v->text);
    if (o.master_addr.empty()) return bad(source_label(*v, "--master_addr") + ": is empty");
  }
  const bool master_port_given = given("master_port") != nullptr;
  if (auto s = int_option("master_port", "--master_port", 0, 65535, o.master_port); !s)
    return s.error();
  if (const ArgValue* v = given("local_addr")) o.local_addr = trim(v->text);
  if (const ArgValue* v = given("logs_specs"); v && v->text != "default") {
    return bad(source_label(*v, "--logs_specs") + ": '" + v->text +
               "' is not available: ctrun has only torch's built-in 'default' (DefaultLogsSpecs: "
               "per-rank files under --log_dir); other LogsSpecs are Python classes");
  }
  if (const ArgValue* v = given("fault_tolerance")) {
    if (v->text != "none" && v->text != "step") {
      return bad(source_label(*v, "--fault_tolerance") + ": invalid choice: '" + v->text +
                 "' (choose from none, step)");
    }
    o.fault_tolerance = v->text;
  }
  if (const ArgValue* v = given("numa_binding")) {
    if (v->text != "node" && v->text != "socket" && v->text != "exclusive" &&
        v->text != "core-complex") {
      return bad("argument --numa-binding/--numa_binding: invalid choice: '" + v->text +
                 "' (choose from node, socket, exclusive, core-complex)");
    }
    o.numa_binding = v->text;
  }
  const ArgValue* signals = given("signals_to_handle");
  if (signals) o.signals_text = signals->text;
  // As torch's agent: a name it cannot register a handler for is warned about and left out.
  auto names = split(o.signals_text, ',');
  if (names.empty()) names.emplace_back();  // "": torch's agent warns about the one empty name
  for (const auto& name : names) {
    auto signo = signal_from_name(trim(name));
    if (!signo || *signo == SIGKILL || *signo == SIGSTOP) {
      const std::string flag = signals ? source_label(*signals, "--signals_to_handle")
                                       : std::string("--signals_to_handle");
      o.warnings.push_back(flag + ": '" + trim(name) +
                           "' is not a signal that can be handled: not handled");
      continue;
    }
    o.signals_to_handle.push_back(*signo);
  }
  if (const ArgValue* v = given("shutdown_timeout")) {
    auto n = python_int(v->text);
    if (!n || *n < 0 || *n > (1 << 30)) {
      return bad(source_label(*v, "--shutdown_timeout") +
                 ": expected a non-negative integer number of seconds, got '" + v->text + "'");
    }
    o.shutdown_timeout = static_cast<double>(*n);
  } else if (auto text = env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    // torchrun reads it with int() and does not check the sign: a negative grace is none.
    auto n = python_int(*text);
    if (!n) {
      return bad("TORCH_ELASTIC_SHUTDOWN_TIMEOUT: expected an integer number of seconds, got '" +
                 *text + "'");
    }
    o.shutdown_timeout = static_cast<double>(std::clamp<long long>(*n, 0, 1 << 30));
  }
  if (const ArgValue* v = given("event_log")) o.event_log = v->text;
  // torchrun's console handler prints the agent's events on stderr as JSON.
  if (o.event_log_handler == "console" && o.event_log.empty()) o.event_log = "/dev/stderr";
  if (auto s = seconds_option("worker_timeout", "--worker_timeout", false, o.worker_timeout); !s) {
    return s.error();
  }
  if (const ArgValue* v = given("straggler_factor")) {
    auto n = to_number(trim(v->text));
    if (!n || (*n != 0 && *n <= 1) || *n > 1e6) {
      return bad(source_label(*v, "--straggler_factor") +
                 ": expected 0 (off) or a factor above 1, got '" + v->text + "'");
    }
    o.straggler_factor = *n;
  }
  if (const ArgValue* v = given("straggler_window")) {
    auto n = python_int(v->text);
    if (!n || *n < 2 || *n > 1000000) {
      return bad(source_label(*v, "--straggler_window") +
                 ": expected a number of steps from 2 to 1000000, got '" + v->text + "'");
    }
    o.straggler_window = static_cast<int>(*n);
  }
  if (auto s =
          seconds_option("straggler_interval", "--straggler_interval", true, o.straggler_interval);
      !s) {
    return s.error();
  }
  if (o.straggler_interval > 86400) {
    return bad("--straggler_interval: expected at most 86400 seconds, got '" +
               given("straggler_interval")->text + "'");
  }
  if (const ArgValue* v = given("health_check")) {
    if (trim(v->text).empty()) return bad("--health_check: expected a command, got ''");
    o.health_check = v->text;
  }
  for (auto [dest, flag_name, out] :
       {std::tuple{"health_check_interval", "--health_check_interval", &o.health_check_interval},
        std::tuple{"health_check_timeout", "--health_check_timeout", &o.health_check_timeout}}) {
    if (auto s = seconds_option(dest, flag_name, true, *out); !s) return s.error();
    if (*out > 86400) {
      return bad(std::string(flag_name) + ": expected at most 86400 seconds, got '" +
                 given(dest)->text + "'");
    }
  }
  if (const ArgValue* v = given("health_min_free_mib")) {
    auto n = python_int(v->text);
    if (!n || *n < 0 || *n > (1LL << 40)) {
      return bad(source_label(*v, "--health_min_free_mib") +
                 ": expected a non-negative number of MiB, got '" + v->text + "'");
    }
    o.health_min_free_mib = *n;
  }
  if (const ArgValue* v = given("health_check_dirs")) {
    for (const auto& dir : split(v->text, ',')) {
      if (!trim(dir).empty()) o.health_check_dirs.push_back(trim(dir));
    }
    if (o.health_check_dirs.empty()) {
      return bad("--health_check_dirs: expected directories, comma-separated, got '" + v->text +
                 "'");
    }
  }
  if (auto s = seconds_option("hang_report_timeout", "--hang_report_timeout", false,
                              o.hang_report_timeout);
      !s) {
    return s.error();
  }
  if (o.hang_report_timeout > 3600) {
    return bad("--hang_report_timeout: expected at most 3600 seconds, got '" +
               given("hang_report_timeout")->text + "'");
  }
  o.flight_recorder = flag("flight_recorder");
  if (auto t = env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")) o.log_line_prefix_template = *t;

  const bool slurm = flag("slurm");
  if (slurm) {
    if (o.standalone) return bad("--slurm and --standalone cannot be used together");
    auto facts = read_slurm_environment(env);
    if (!facts) return facts.error();
    ExplicitOptions explicit_options;
    explicit_options.nnodes = given("nnodes") != nullptr;
    explicit_options.node_rank = o.node_rank_given;
    explicit_options.nproc_per_node = given("nproc_per_node") != nullptr;
    explicit_options.rdzv_backend = given("rdzv_backend") != nullptr;
    explicit_options.rdzv_endpoint = !o.rdzv_endpoint.empty();
    explicit_options.rdzv_id = given("rdzv_id") != nullptr;
    explicit_options.master_addr = given("master_addr") != nullptr;
    explicit_options.master_port = master_port_given;
    if (auto s = apply_slurm(facts.value(), explicit_options, o); !s) return s.error();
  }
  o.stop_on_stdin_close = flag("stop_on_stdin_close");
  if (const ArgValue* v = given("faults")) {
    if (v->text.empty()) return bad("--faults: expected a plan file, an inline plan or random:...");
    o.faults = v->text;
  }
  if (const ArgValue* v = given("fault_report")) {
    if (v->text.empty()) return bad("--fault_report: expected a file, got ''");
    o.fault_report = v->text;
  }
  if (auto s = read_cluster_options(table, a, o); !s) return s.error();
  if (o.cluster) return parsed;  // the hosts' agents get their own settings (cluster_plan.h)
  if (o.node_rank >= o.max_nodes) {
    return bad("--node_rank: " + std::to_string(o.node_rank) +
               " is not below the number of nodes (" + std::to_string(o.max_nodes) + ")");
  }

  // PyTorch main's run(): a static rendezvous that names no endpoint and no port, for one node,
  // becomes a c10d one on a free local port with a random run id, so that two single-node jobs
  // on one machine do not both want port 29500. ctrun's --standalone is exactly that.
  if (!slurm && !o.standalone && o.rdzv_backend == "static" && o.rdzv_endpoint.empty() &&
      !master_port_given && o.max_nodes == 1) {
    o.standalone = true;
  }
  if (o.standalone) {  // torchrun overrides whatever backend and endpoint were given
    o.rdzv_backend = "c10d";
    o.rdzv_endpoint = "localhost:0";
    return parsed;
  }
  if (o.rdzv_backend == "static" && !o.rdzv_endpoint.empty()) {
    // torchrun: an endpoint given with the static backend is node rank 0's address and port,
    // over --master_addr and --master_port; it must have a port.
    auto ep = parse_rdzv_endpoint(o.rdzv_endpoint, 0);
    if (!ep) return ep.error();
    if (!endpoint_has_port(o.rdzv_endpoint)) {
      return bad("--rdzv_endpoint: the static backend needs a port (HOST:PORT), got '" +
                 o.rdzv_endpoint + "'");
    }
    o.master_addr = ep.value().host;
    o.master_port = ep.value().port;
  }
  if (o.rdzv_backend == "c10d" || o.rdzv_backend == "ctrund") {
    if (!o.rdzv_endpoint.empty()) {
      auto ep = parse_rdzv_endpoint(o.rdzv_endpoint, rendezvous::kDefaultPort);
      if (!ep) return ep.error();
      if (ep.value().port == 0 && o.max_nodes > 1) {
        return bad(
            "--rdzv_endpoint: port 0 (the host picks a free port) works on one node only; "
            "with --nnodes=" +
            std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) +
            " give the port the other nodes connect to");
      }
    }
  }
  if ((o.rdzv_backend == "static") && o.master_port == 0 && o.max_nodes > 1) {
    return bad(
        "--master_port: port 0 (a free port) works on one node only; give the port the "
        "other nodes connect to");
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
