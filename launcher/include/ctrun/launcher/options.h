// The ctrun command line, flag for flag with torchrun (PyTorch main's torch/distributed/run.py,
// read with argparse's rules: see launcher/cli/arg_parser.h and the table in docs/env.md):
// parsed and checked, with no side effects. Every option also comes from a PET_<NAME>
// environment variable (flag, then variable, then default), as torchrun does, so Kubeflow and
// TorchX launch ctrun unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

using rendezvous::Error;
using rendezvous::Result;

// Which of a worker's streams go to files: torchrun's Std flags (0 none, 1 out, 2 err, 3 both),
// one value for every local rank or a map "0:1,1:2".
struct StdSpec {
  int all = 0;
  std::map<int, int> per_rank;
  int for_rank(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  bool empty() const { return all == 0 && per_rank.empty(); }
};
Result<StdSpec> parse_std_spec(const std::string& text, const std::string& flag);

// torchrun's comma_separated_list type: items split at ',', where ",," stands for a comma inside
// an item ("a,,b,c" -> {"a,b", "c"}); "" -> {""}, one empty item (which, as a filter, matches
// every line). Done as torchrun does it, through the placeholder text "<COMMA_PLACEHOLDER>", so
// that text given literally also reads as a comma.
std::vector<std::string> parse_comma_separated_list(const std::string& text);

struct RendezvousConf {
  double join_timeout = 600;  // seconds, as torchrun's --rdzv_conf
  double last_call_timeout = 30;
  double close_timeout = 30;
  double keep_alive_interval = 5;
  int keep_alive_max_attempt = 3;
  std::optional<bool> is_host;
  std::string token_file;
  // TLS, with torch's etcd keys: protocol (http or https; https:// endpoints say https too;
  // tcp and tls mean the same), cacert, cert, key (or etcd-v2's ca_cert, ssl_cert,
  // ssl_cert_key), for etcd and ctrund alike; and etcd's user: user, password_file (ours).
  std::string protocol;
  std::string cacert;
  std::string cert;
  std::string key;
  std::string user;
  std::string password_file;
  // The limits of a rendezvous this agent hosts (as ctrund's flags of the same names; unset:
  // ctrund's defaults, the worker store's derived from the job's size: docs/ctrund.md).
  std::optional<std::size_t> max_connections;
  std::optional<std::size_t> max_connections_per_host;
  std::optional<std::size_t> worker_store_max_connections;
  std::vector<std::string> ignored_keys;  // accepted for torchrun compatibility, not used
};
Result<RendezvousConf> parse_rdzv_conf(const std::string& text);

// `ctrun --hostfile FILE` / `--hosts LIST`: this ctrun launches the job on every host over ssh
// instead of being one node's agent (docs/cluster.md).
struct ClusterOptions {
  std::string hostfile;  // one of the two is set
  std::string hosts;
  std::string include;  // --include / --exclude: HOST[:SLOT,...]@HOST...
  std::string exclude;
  std::string ssh = "ssh";  // the ssh command, split into words (quotes group them)
  int ssh_port = 0;         // 0: ssh's own (its config, else 22)
  // Variables sent to every host beside the defaults: NAME, or PREFIX* for every variable
  // whose name starts with PREFIX.
  std::vector<std::string> forward_env;
  std::string env_file;  // NAME=VALUE lines sent too; empty: ./.ctrun_env and ~/.ctrun_env
  bool dry_run = false;
  std::string remote_ctrun;  // ctrun's path on the hosts; empty: this ctrun's own path
  // What was given (else the launcher decides: the host count, the slots, a new job id).
  bool nnodes_given = false;
  bool nproc_given = false;
  bool rdzv_id_given = false;
  bool rdzv_endpoint_given = false;
  std::string rdzv_conf;  // --rdzv_conf's text as given, for the agents
  // The rest of the command line, for each host's agent: every option given (on the command
  // line or as PET_*) but the ones the launcher sets per host, as --name=value, then the
  // entrypoint and its arguments.
  std::vector<std::string> agent_args;
};

struct LaunchOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  std::string nproc_per_node = "1";  // N, cpu, gpu or auto: resolved by resolve_nproc()
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  RendezvousConf rdzv_conf;
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;  // accepted; exits are seen by events, not polling
  std::string start_method = "spawn";
  // null, dynamic_rendezvous (no events) or console (the events to stderr, via event_log).
  std::string event_log_handler = "null";
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::string log_dir;  // empty: a fresh temporary directory
  StdSpec redirects;
  StdSpec tee;
  std::vector<int> local_ranks_filter;  // empty: every local rank on the console
  // --duplicate-stdout-filters / --duplicate-stderr-filters: the workers' console lines of that
  // stream that contain any of these texts are also written, prefixed as on the console, to
  // LOG_DIR/RUN_ID/attempt_N/filtered_stdout.log (filtered_stderr.log); empty: no such file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  int node_rank = 0;
  bool node_rank_given = false;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string local_addr;
  // Signal numbers. A name torch's agent cannot register a handler for (unknown, SIGKILL,
  // SIGSTOP) is left out with a line in `warnings`, as torchrun only warns.
  std::vector<int> signals_to_handle;
  std::string signals_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";  // as given (the workers are told)
  std::vector<std::string> warnings;                           // said by the agent at start
  // --shutdown_timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 (whole seconds).
  double shutdown_timeout = 30;
  // LOCAL_RANK=0 for every worker and CUDA_VISIBLE_DEVICES narrowed to the worker's device.
  bool virtual_local_rank = false;
  // --numa-binding: node, socket, exclusive or core-complex (torchrun's modes); empty: none.
  std::string numa_binding;
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: the console prefix of each worker's lines, with
  // ${role_name}, ${rank} and ${local_rank} (log_line_prefix.h); empty: "[<role><rank>]:".
  std::string log_line_prefix_template;
  // ctrun's own: a worker whose heartbeat file (CTRUN_HEARTBEAT_FILE) stops changing for this
  // long after its first beat is SIGKILLed and the job restarts; 0 turns it off.
  double worker_timeout = 0;
  // ctrun's own: a rank whose own time per step (its step less its waits for its peers, where
  // the worker measures them; else its step time) is this many times the job's median over the
  // last straggler_window steps is named a straggler, every straggler_interval seconds at most
  // (docs/cluster.md). Unset: 2 where the workers have
  // heartbeat files (--worker_timeout, --faults, --fault_report), else off; set, it gives them
  // the files; 0 turns it off.
  std::optional<double> straggler_factor;
  int straggler_window = 50;
  double straggler_interval = 5;
  // ctrun's own: before each join the node checks its health (docs/cluster.md): this command
  // (run by /bin/sh; exit 0 = healthy; empty: none) within health_check_timeout seconds, the
  // free space of the log directory and of health_check_dirs (at least health_min_free_mib MiB;
  // 0: not checked), and its GPUs where NVIDIA's library is present. An unhealthy node does not
  // join: it checks again every health_check_interval seconds, up to the join timeout.
  std::string health_check;
  double health_check_interval = 30;
  double health_check_timeout = 60;
  std::int64_t health_min_free_mib = 100;
  std::vector<std::string> health_check_dirs;
  // ctrun's own: when --worker_timeout finds a worker hung, every agent of the job takes its
  // workers' stacks and last steps, and the finding agent reports the whole job's, grouped by
  // where the ranks stand (docs/faults.md, "Hang reports"); the hung worker is killed once the
  // report is made or after this many seconds; 0: no report.
  double hang_report_timeout = 15;
  // ctrun's own: the workers' NCCL Flight Recorder on (torch 2.x: TORCH_NCCL_TRACE_BUFFER_SIZE,
  // a dump on timeout and a pipe to ask for one), its dumps read into hang reports.
  bool flight_recorder = false;
  // ctrun's own: "none" (torchrun's: any failure restarts every worker) or "step" (a failed
  // worker is replaced alone and nobody is stopped for a membership change; the workers keep
  // their replicas consistent step by step: docs/fault_tolerance.md).
  std::string fault_tolerance = "none";
  // ctrun's own: append the agent's events (join, round, worker exit, restart, ...) to this
  // file as JSON lines; empty: none.
  std::string event_log;
  // ctrun's own: stop (as on SIGTERM) when standard input reaches its end: how the launcher of
  // --hostfile stops each host's agent, by closing its ssh session's input.
  bool stop_on_stdin_close = false;
  // ctrun's own: a fault plan to inject into this node's workers (a JSON file, an inline plan
  // or random:seed=...; docs/faults.md); empty: none.
  std::string faults;
  // With --faults: write what became of each fault this agent injected here, as JSON.
  std::string fault_report;
  std::optional<ClusterOptions> cluster;  // --hostfile / --hosts
  std::string entrypoint;
  std::vector<std::string> script_args;
};

// Looks up environment variables; injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

enum class ParseOutcome { kRun, kHelp, kVersion };
struct Parsed {
  ParseOutcome outcome = ParseOutcome::kRun;
  LaunchOptions options;
  std::string text;  // the help or version text
};
// argv without the program name. Errors name the flag and what was expected.
Result<Parsed> parse_launch_options(const std::vector<std::string>& args, const EnvLookup& env);

// nproc_per_node as a number: cpu = online cores, gpu = visible NVIDIA devices (an error when
// there is none), auto = gpu when there are GPUs, else cpu.
struct MachineFacts {
  int cpu_count = 1;
  int gpu_count = 0;
};
MachineFacts probe_machine(const EnvLookup& env);
// The devices a CUDA_VISIBLE_DEVICES value lists, read as CUDA does: up to the first empty or
// "-1" entry ("" and "-1" hide every device).
int count_visible_devices(const std::string& cuda_visible_devices);
Result<int> resolve_nproc(const std::string& nproc_per_node, const MachineFacts& machine);

// --rdzv_endpoint, parsed where the rendezvous part defines it.
using rendezvous::Endpoint;
using rendezvous::parse_endpoint;
// parse_endpoint, and port 0 written out ("host:0", "[::1]:0") read as the launcher means it:
// the hosting agent binds a free port (TCPStore(port=0)), which works on a single node only.
Result<Endpoint> parse_rdzv_endpoint(const std::string& text, std::uint16_t default_port);

std::optional<int> signal_from_name(const std::string& name);
std::string signal_name(int signo);
// TORCHELASTIC_HEALTH_CHECK_PORT's value: a port from 1 to 65535 written as torch's int() reads
// it (blanks around it, a sign, '_' between digits); nothing otherwise.
std::optional<std::uint16_t> health_check_port(std::string_view value);

}  // namespace ctrun::launcher
