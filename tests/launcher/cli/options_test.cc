#include "ctrun/launcher/options.h"

#include <csignal>
#include <map>

#include "catch.h"
#include "fake_env.h"

using namespace ctrun::launcher;

using ctrun::testing::env_of;

namespace {

LaunchOptions parse_ok(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  auto r = parse_launch_options(args, env_of(env));
  INFO((r ? "" : r.error().message));
  REQUIRE(r.ok());
  REQUIRE(r.value().outcome == ParseOutcome::kRun);
  return r.value().options;
}

std::string parse_error(std::vector<std::string> args,
                        std::map<std::string, std::string> env = {}) {
  auto r = parse_launch_options(args, env_of(env));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("options: torchrun's defaults") {
  auto o = parse_ok({"train.py"});
  CHECK(o.min_nodes == 1);
  CHECK(o.max_nodes == 1);
  CHECK(o.nproc_per_node == "1");
  // One node, static, no endpoint and no --master_port: PyTorch main runs it as --standalone
  // (c10d on a free local port); see "the single-node rule" below.
  CHECK(o.rdzv_backend == "c10d");
  CHECK(o.rdzv_id == "none");
  CHECK(o.max_restarts == 0);
  CHECK(o.monitor_interval == 0.1);  // PyTorch main's default
  CHECK(o.role == "default");
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 29500);
  CHECK(o.node_rank == 0);
  CHECK(o.shutdown_timeout == 30);
  CHECK(o.worker_timeout == 0);
  CHECK(o.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(o.rdzv_conf.join_timeout == 600);
  CHECK(o.rdzv_conf.last_call_timeout == 30);
  CHECK(o.rdzv_conf.keep_alive_interval == 5);
  CHECK(o.rdzv_conf.keep_alive_max_attempt == 3);
  CHECK(o.entrypoint == "train.py");
  CHECK(o.script_args.empty());
}

TEST_CASE("options: every flag in both spellings") {
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"--nproc_per_node", "--nproc-per-node"},
      {"--rdzv_backend", "--rdzv-backend"},
      {"--rdzv_endpoint", "--rdzv-endpoint"},
      {"--rdzv_id", "--rdzv-id"},
      {"--max_restarts", "--max-restarts"},
      {"--monitor_interval", "--monitor-interval"},
      {"--log_dir", "--log-dir"},
      {"--node_rank", "--node-rank"},
      {"--master_addr", "--master-addr"},
      {"--master_port", "--master-port"},
      {"--local_addr", "--local-addr"},
      {"--shutdown_timeout", "--shutdown-timeout"},
      {"--worker_timeout", "--worker-timeout"},
  };
  for (const auto& [underscore, dash] : pairs) {
    const std::string value = underscore == "--rdzv_backend"    ? "c10d"
                              : underscore == "--rdzv_endpoint" ? "h:1"  // static: HOST:PORT
                                                                : "1";
    auto a = parse_ok({underscore + "=" + value, "--nnodes=2", "x"});
    auto b = parse_ok({dash, value, "--nnodes=2", "x"});
    INFO(underscore);
    CHECK(a.nproc_per_node == b.nproc_per_node);
    CHECK(a.rdzv_backend == b.rdzv_backend);
    CHECK(a.rdzv_endpoint == b.rdzv_endpoint);
    CHECK(a.rdzv_id == b.rdzv_id);
    CHECK(a.max_restarts == b.max_restarts);
    CHECK(a.log_dir == b.log_dir);
    CHECK(a.node_rank == b.node_rank);
    CHECK(a.master_addr == b.master_addr);
    CHECK(a.master_port == b.master_port);
    CHECK(a.local_addr == b.local_addr);
    CHECK(a.shutdown_timeout == b.shutdown_timeout);
    CHECK(a.worker_timeout == b.worker_timeout);
  }
  CHECK(parse_ok({"--no-python", "x"}).no_python);
  CHECK(parse_ok({"--no_python", "x"}).no_python);
  CHECK(parse_ok({"--run-path", "x"}).run_path);
  CHECK(parse_ok({"-m", "pkg.mod"}).module);
  CHECK(parse_ok({"--local-ranks-filter=0,2", "x"}).local_ranks_filter == std::vector<int>{0, 2});
}

TEST_CASE("options: everything after the entrypoint belongs to the workers") {
  auto o =
      parse_ok({"--nproc_per_node=4", "train.py", "--epochs", "10", "--nproc_per_node=9", "-m"});
  CHECK(o.nproc_per_node == "4");
  CHECK(o.entrypoint == "train.py");
  CHECK(o.script_args == std::vector<std::string>{"--epochs", "10", "--nproc_per_node=9", "-m"});
  CHECK_FALSE(o.module);
}

TEST_CASE("options: PET_ variables, with flags taking precedence") {
  auto from_env = parse_ok({"x"}, {{"PET_NPROC_PER_NODE", "3"},
                                   {"PET_NNODES", "1:4"},
                                   {"PET_RDZV_ID", "job7"},
                                   {"PET_STANDALONE", "1"},
                                   {"PET_MAX_RESTARTS", "2"}});
  CHECK(from_env.nproc_per_node == "3");
  CHECK(from_env.min_nodes == 1);
  CHECK(from_env.max_nodes == 4);
  CHECK(from_env.rdzv_id == "job7");
  CHECK(from_env.standalone);
  CHECK(from_env.max_restarts == 2);
  auto flag_wins = parse_ok({"--nproc_per_node=2", "x"}, {{"PET_NPROC_PER_NODE", "3"}});
  CHECK(flag_wins.nproc_per_node == "2");
  CHECK(parse_error({"x"}, {{"PET_STANDALONE", "yes"}}) ==
        "PET_STANDALONE: expected 0 or 1, got 'yes'");
  CHECK(parse_error({"x"}, {{"PET_MAX_RESTARTS", "-1"}}).find("--max_restarts") !=
        std::string::npos);
}

TEST_CASE("options: nnodes, rdzv_conf, std specs and signals") {
  auto o = parse_ok({"--nnodes=2:8",
                     "--rdzv_conf=join_timeout=60,last_call_timeout=1.5,is_host=false,"
                     "keep_alive_max_attempt=5,token_file=/t,read_timeout=9",
                     "--redirects=0:1,1:2", "--tee=3", "--signals_to_handle=SIGTERM,USR1", "x"});
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 8);
  CHECK(o.rdzv_conf.join_timeout == 60);
  CHECK(o.rdzv_conf.last_call_timeout == 1.5);
  CHECK(o.rdzv_conf.is_host == false);
  CHECK(o.rdzv_conf.keep_alive_max_attempt == 5);
  CHECK(o.rdzv_conf.token_file == "/t");
  CHECK(o.rdzv_conf.ignored_keys == std::vector<std::string>{"read_timeout"});
  CHECK(o.redirects.for_rank(0) == 1);
  CHECK(o.redirects.for_rank(1) == 2);
  CHECK(o.redirects.for_rank(5) == 0);
  CHECK(o.tee.for_rank(7) == 3);
  CHECK(o.signals_to_handle == std::vector<int>{SIGTERM, SIGUSR1});
}

TEST_CASE("options: bad values name the flag and what was expected") {
  CHECK(parse_error({"--nnodes=0", "x"}) ==
        "--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got '0'");
  CHECK(parse_error({"--nnodes=4:2", "x"}).find("--nnodes") == 0);
  CHECK(parse_error({"--nnodes=a:b", "x"}).find("--nnodes") == 0);
  CHECK(parse_error({"--nproc_per_node=many", "x"}).find("--nproc_per_node: expected") == 0);
  CHECK(parse_error({"--nproc_per_node=0", "x"}).find("--nproc_per_node") == 0);
  CHECK(parse_error({"--rdzv_backend=zookeeper", "x"}) ==
        "--rdzv_backend: expected static, c10d, ctrund, etcd or etcd-v2, got 'zookeeper'");
  CHECK(parse_error({"--master_port=70000", "x"})
            .find("--master_port: expected an integer in 0..65535") == 0);
  CHECK(parse_error({"--max_restarts=two", "x"}).find("--max_restarts") == 0);
  CHECK(parse_error({"--monitor_interval=0", "x"}).find("--monitor_interval") == 0);
  CHECK(parse_error({"--shutdown_timeout=-1", "x"}).find("--shutdown_timeout") == 0);
  CHECK(parse_error({"--worker_timeout=soon", "x"}) ==
        "--worker_timeout: expected a non-negative number of seconds, got 'soon'");
  CHECK(parse_ok({"--worker_timeout=2.5", "x"}).worker_timeout == 2.5);
  CHECK(parse_error({"--redirects=4", "x"}).find("--redirects: expected 0-3") == 0);
  CHECK(parse_error({"--tee=0:9", "x"}).find("--tee") == 0);
  CHECK(parse_error({"--rdzv_conf=join_timeout", "x"}).find("--rdzv_conf: expected key=value") ==
        0);
  CHECK(parse_error({"--rdzv_conf=join_timeout=soon", "x"}).find("--rdzv_conf: join_timeout") == 0);
  CHECK(parse_error({"--rdzv_conf=is_host=maybe", "x"}).find("is_host") != std::string::npos);
  // Names torch's agent cannot register a handler for: warned about and left out, not refused.
  const LaunchOptions odd = parse_ok({"--signals_to_handle=SIGFOO,SIGUSR2,SIGKILL", "x"});
  CHECK(odd.signals_to_handle == std::vector<int>{SIGUSR2});
  REQUIRE(odd.warnings.size() == 2);
  CHECK(odd.warnings[0] ==
        "--signals_to_handle: 'SIGFOO' is not a signal that can be handled: not handled");
  CHECK(odd.warnings[1].find("'SIGKILL'") != std::string::npos);
  CHECK(parse_ok({"x"}).warnings.empty());
  CHECK(parse_error({"--local_ranks_filter=a", "x"}).find("--local_ranks_filter") == 0);
  CHECK(parse_error({"--nnodes=2", "--node_rank=2", "x"}).find("--node_rank: 2 is not below") == 0);
  CHECK(parse_error({"-m", "--no_python", "x"}).find("cannot be used together") !=
        std::string::npos);
  CHECK(parse_error({}).find("missing the training program") == 0);
  CHECK(parse_error({"--frobnicate", "x"}).find("frobnicate") != std::string::npos);
  CHECK(parse_error({"--nnodes"}).find("nnodes") != std::string::npos);
}

TEST_CASE("options: help and version") {
  auto help = parse_launch_options({"--help"}, env_of({}));
  REQUIRE(help);
  CHECK(help.value().outcome == ParseOutcome::kHelp);
  CHECK(help.value().text.find("--nproc_per_node") != std::string::npos);
  auto version = parse_launch_options({"--version"}, env_of({}));
  REQUIRE(version);
  CHECK(version.value().outcome == ParseOutcome::kVersion);
  CHECK(version.value().text.rfind("ctrun ", 0) == 0);
  CHECK(version.value().text.find(" (revision ") != std::string::npos);
}

TEST_CASE("options: nproc_per_node words") {
  MachineFacts no_gpu{8, 0};
  MachineFacts gpus{8, 4};
  CHECK(resolve_nproc("3", no_gpu).value() == 3);
  CHECK(resolve_nproc("cpu", gpus).value() == 8);
  CHECK(resolve_nproc("gpu", gpus).value() == 4);
  CHECK(resolve_nproc("auto", gpus).value() == 4);
  CHECK(resolve_nproc("auto", no_gpu).value() == 8);
  auto none = resolve_nproc("gpu", no_gpu);
  REQUIRE_FALSE(none);
  CHECK(none.error().message.find("no NVIDIA GPU") != std::string::npos);
  CHECK(probe_machine(env_of({{"CUDA_VISIBLE_DEVICES", ""}})).gpu_count == 0);
  CHECK(probe_machine(env_of({})).cpu_count >= 1);
}

TEST_CASE("options: rendezvous endpoints, IPv4, names and bracketed IPv6") {
  auto plain = parse_endpoint("node0", 29400);
  REQUIRE(plain);
  CHECK(plain.value().host == "node0");
  CHECK(plain.value().port == 29400);
  auto with_port = parse_endpoint("10.0.0.1:1234", 29400);
  REQUIRE(with_port);
  CHECK(with_port.value().host == "10.0.0.1");
  CHECK(with_port.value().port == 1234);
  auto v6 = parse_endpoint("[::1]:29401", 29400);
  REQUIRE(v6);
  CHECK(v6.value().host == "::1");
  CHECK(v6.value().port == 29401);
  CHECK(parse_endpoint("[fe80::1]", 29400).value().port == 29400);
  CHECK(parse_endpoint("::1", 29400).error().message.find("in brackets") != std::string::npos);
  CHECK(parse_endpoint("[::1", 29400).error().message.find("unclosed") != std::string::npos);
  CHECK(parse_endpoint("host:99999", 29400).error().message.find("1..65535") != std::string::npos);
  CHECK(parse_endpoint("host:", 29400).error().message.find("no port") != std::string::npos);
  CHECK(parse_endpoint(":29400", 29400).error().message.find("no host") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// torchrun's command line, row by row of the table in docs/env.md ("The command line").
// ---------------------------------------------------------------------------------------------

namespace {

// A value option: its option strings, its shortest unambiguous abbreviation, a value and what
// that value makes of the options.
struct ValueRow {
  std::vector<std::string> names;
  std::string abbreviation;
  std::string pet;  // empty: none
  std::string value;
  std::function<std::string(const LaunchOptions&)> field;
};

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int i : v) {
    if (!out.empty()) out += ',';
    out += std::to_string(i);
  }
  return out;
}

// A list of texts as one string, items between '|' (texts that may hold commas).
std::string join_texts(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "|" : "") + v[i];
  return out;
}

const std::vector<ValueRow>& value_rows() {
  static const std::vector<ValueRow> rows = {
      {{"--nnodes"},
       "--nn",
       "PET_NNODES",
       "2:3",
       [](const LaunchOptions& o) {
         return std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes);
       }},
      {{"--nproc-per-node", "--nproc_per_node"},
       "--nproc_",
       "PET_NPROC_PER_NODE",
       "3",
       [](const LaunchOptions& o) { return o.nproc_per_node; }},
      {{"--rdzv-backend", "--rdzv_backend"},
       "--rdzv-b",
       "PET_RDZV_BACKEND",
       "etcd",
       [](const LaunchOptions& o) { return o.rdzv_backend; }},
      {{"--rdzv-endpoint", "--rdzv_endpoint"},
       "--rdzv_e",
       "PET_RDZV_ENDPOINT",
       "node0:1234",
       [](const LaunchOptions& o) { return o.rdzv_endpoint; }},
      {{"--rdzv-id", "--rdzv_id"},
       "--rdzv-i",
       "PET_RDZV_ID",
       "job9",
       [](const LaunchOptions& o) { return o.rdzv_id; }},
      {{"--rdzv-conf", "--rdzv_conf"},
       "--rdzv_c",
       "PET_RDZV_CONF",
       "join_timeout=7",
       [](const LaunchOptions& o) { return std::to_string(int(o.rdzv_conf.join_timeout)); }},
      {{"--max-restarts", "--max_restarts"},
       "--max-",
       "PET_MAX_RESTARTS",
       "4",
       [](const LaunchOptions& o) { return std::to_string(o.max_restarts); }},
      {{"--monitor-interval", "--monitor_interval"},
       "--monitor_",
       "PET_MONITOR_INTERVAL",
       "2",
       [](const LaunchOptions& o) { return std::to_string(int(o.monitor_interval)); }},
      {{"--start-method", "--start_method"},
       "--start-",
       "PET_START_METHOD",
       "fork",
       [](const LaunchOptions& o) { return o.start_method; }},
      {{"--event-log-handler", "--event_log_handler"},
       "--event-log-",
       "PET_EVENT_LOG_HANDLER",
       "dynamic_rendezvous",
       [](const LaunchOptions& o) { return o.event_log_handler; }},
      {{"--role"}, "--ro", "PET_ROLE", "trainer", [](const LaunchOptions& o) { return o.role; }},
      {{"--log-dir", "--log_dir"},
       "--log-",
       "PET_LOG_DIR",
       "/tmp/logs",
       [](const LaunchOptions& o) { return o.log_dir; }},
      {{"-r", "--redirects"},
       "--re",
       "PET_REDIRECTS",
       "3",
       [](const LaunchOptions& o) { return std::to_string(o.redirects.all); }},
      {{"-t", "--tee"},
       "--t",
       "PET_TEE",
       "2",
       [](const LaunchOptions& o) { return std::to_string(o.tee.all); }},
      {{"--local-ranks-filter", "--local_ranks_filter"},
       "--local-r",
       "PET_LOCAL_RANKS_FILTER",
       "0,2",
       [](const LaunchOptions& o) { return join_ints(o.local_ranks_filter); }},
      {{"--duplicate-stdout-filters", "--duplicate_stdout_filters"},
       "--duplicate-stdo",
       "PET_DUPLICATE_STDOUT_FILTERS",
       "loss,,x,step",
       [](const LaunchOptions& o) { return join_texts(o.duplicate_stdout_filters); }},
      {{"--duplicate-stderr-filters", "--duplicate_stderr_filters"},
       "--duplicate_stde",
       "PET_DUPLICATE_STDERR_FILTERS",
       "Traceback,NCCL",
       [](const LaunchOptions& o) { return join_texts(o.duplicate_stderr_filters); }},
      {{"--node-rank", "--node_rank"},
       "--node_",
       "PET_NODE_RANK",
       "1",
       [](const LaunchOptions& o) { return std::to_string(o.node_rank); }},
      {{"--master-addr", "--master_addr"},
       "--master-a",
       "PET_MASTER_ADDR",
       "10.0.0.2",
       [](const LaunchOptions& o) { return o.master_addr; }},
      {{"--master-port", "--master_port"},
       "--master_p",
       "PET_MASTER_PORT",
       "1234",
       [](const LaunchOptions& o) { return std::to_string(o.master_port); }},
      {{"--local-addr", "--local_addr"},
       "--local-a",
       "PET_LOCAL_ADDR",
       "10.0.0.3",
       [](const LaunchOptions& o) { return o.local_addr; }},
      {{"--logs-specs", "--logs_specs"},
       "--logs-",
       "",
       "default",
       [](const LaunchOptions&) { return std::string("default"); }},
      {{"--signals-to-handle", "--signals_to_handle"},
       "--signals-",
       "PET_SIGNALS_TO_HANDLE",
       "SIGUSR1",
       [](const LaunchOptions& o) { return join_ints(o.signals_to_handle); }},
      {{"--shutdown-timeout", "--shutdown_timeout"},
       "--shutdown_",
       "PET_SHUTDOWN_TIMEOUT",
       "7",
       [](const LaunchOptions& o) { return std::to_string(int(o.shutdown_timeout)); }},
      // ctrun's own
      {{"--worker-timeout", "--worker_timeout"},
       "--worker-",
       "PET_WORKER_TIMEOUT",
       "3",
       [](const LaunchOptions& o) { return std::to_string(int(o.worker_timeout)); }},
      {{"--event-log", "--event_log"},
       "--event_log",
       "PET_EVENT_LOG",
       "/tmp/events",
       [](const LaunchOptions& o) { return o.event_log; }},
  };
  return rows;
}

// Two nodes: no single-node rule, and --node_rank=1 is valid.
const std::vector<std::string> kTwoNodes = {"--nnodes=2"};

LaunchOptions parse_two_nodes(std::vector<std::string> options,
                              std::map<std::string, std::string> env = {}) {
  if (!env.count("PET_NNODES")) options.insert(options.begin(), kTwoNodes.front());
  options.push_back("train.py");
  return parse_ok(options, env);
}

}  // namespace

TEST_CASE("options: every value option, spelled every way torchrun accepts") {
  const LaunchOptions defaults = parse_two_nodes({});
  for (const auto& row : value_rows()) {
    INFO(row.names.front());
    const std::string expected = row.field(parse_two_nodes({row.names.front(), row.value}));
    if (row.names.front() != "--logs-specs") CHECK(expected != row.field(defaults));
    for (const auto& name : row.names) {
      CHECK(row.field(parse_two_nodes({name, row.value})) == expected);
      CHECK(row.field(parse_two_nodes({name + "=" + row.value})) == expected);
      CHECK(row.field(parse_two_nodes({name, "0", name, row.value})) == expected);  // last wins
    }
    CHECK(row.field(parse_two_nodes({row.abbreviation, row.value})) == expected);
    CHECK(row.field(parse_two_nodes({row.abbreviation + "=" + row.value})) == expected);
    if (!row.pet.empty()) {
      CHECK(row.field(parse_two_nodes({}, {{row.pet, row.value}, {"PET_NNODES", "2"}})) ==
            expected);
    }
  }
}

TEST_CASE("options: every flag, spelled every way torchrun accepts, and its PET_ variable") {
  struct FlagRow {
    std::vector<std::string> names;
    std::string abbreviation;
    std::string pet;
    bool LaunchOptions::*field;
  };
  const std::vector<FlagRow> rows = {
      {{"--standalone"}, "--stan", "PET_STANDALONE", &LaunchOptions::standalone},
      {{"-m", "--module"}, "--mod", "PET_MODULE", &LaunchOptions::module},
      {{"--no-python", "--no_python"}, "--no-", "PET_NO_PYTHON", &LaunchOptions::no_python},
      {{"--run-path", "--run_path"}, "--run_", "PET_RUN_PATH", &LaunchOptions::run_path},
      {{"--virtual-local-rank", "--virtual_local_rank"},
       "--virtual-",
       "PET_VIRTUAL_LOCAL_RANK",
       &LaunchOptions::virtual_local_rank},
  };
  for (const auto& row : rows) {
    INFO(row.names.front());
    CHECK_FALSE(parse_two_nodes({}).*row.field);
    for (const auto& name : row.names) CHECK(parse_two_nodes({name}).*row.field);
    CHECK(parse_two_nodes({row.abbreviation}).*row.field);
    CHECK(parse_two_nodes({}, {{row.pet, " 1 "}, {"PET_NNODES", "2"}}).*row.field);
    CHECK(parse_two_nodes({}, {{row.pet, "-1"}, {"PET_NNODES", "2"}}).*row.field);
    CHECK_FALSE(parse_two_nodes({}, {{row.pet, "0"}, {"PET_NNODES", "2"}}).*row.field);
    CHECK(parse_error({"x"}, {{row.pet, "true"}}) == row.pet + ": expected 0 or 1, got 'true'");
    CHECK(parse_error({row.names.back() + "=1", "x"}).find(": ignored explicit argument '1'") !=
          std::string::npos);
  }
}

TEST_CASE("options: argparse's errors for the command line itself") {
  CHECK(parse_error({"--nproc", "2", "x"}) ==
        "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node");
  CHECK(parse_error({"--st", "x"}) ==
        "ambiguous option: --st could match --standalone, --start-method, --start_method");
  // ctrun's --event_log makes --event- ambiguous; --event-log is ctrun's, written in full.
  CHECK(parse_error({"--event-", "null", "x"}) ==
        "ambiguous option: --event- could match --event-log-handler, --event-log");
  CHECK(parse_error({"--event_", "null", "x"}) ==
        "ambiguous option: --event_ could match --event_log_handler, --event_log");
  CHECK(parse_error({"--standalone=1", "x"}) ==
        "argument --standalone: ignored explicit argument '1'");
  CHECK(parse_error({"--nnodes", "-x", "x"}) == "argument --nnodes: expected one argument");
  CHECK(parse_error({"-nnodes", "2", "x"}) == "unrecognized arguments: -nnodes");
  auto combined = parse_ok({"-mr3", "pkg.mod", "--nproc", "3"});
  CHECK(combined.module);
  CHECK(combined.redirects.all == 3);
  CHECK(combined.script_args == std::vector<std::string>{"--nproc", "3"});
  auto dashes = parse_ok({"--nnodes=2", "--", "train.py", "--", "-x"});
  CHECK(dashes.entrypoint == "train.py");
  CHECK(dashes.script_args == std::vector<std::string>{"--", "-x"});
  CHECK(parse_ok({"--", "train.py", "--", "-x"}).script_args ==
        std::vector<std::string>{"--", "-x"});
  CHECK(parse_ok({"train.py", "--", "-x"}).script_args == std::vector<std::string>{"-x"});
  // "-1" is a value (a negative number), refused by the option's own check.
  CHECK(
      parse_error({"--max_restarts", "-1", "x"}).rfind("--max_restarts: expected an integer", 0) ==
      0);
}

TEST_CASE("options: values read as torchrun's types read them") {
  // int(): whitespace, sign, underscores.
  CHECK(parse_ok({"--nnodes= 1 : 2 ", "x"}).max_nodes == 2);
  CHECK(parse_ok({"--nproc_per_node= 2 ", "x"}).nproc_per_node == "2");
  CHECK(parse_ok({"--max_restarts=+1_0", "x"}).max_restarts == 10);
  CHECK(parse_ok({"--master_port= 29501", "x"}).master_port == 29501);
  CHECK(parse_ok({"--local_ranks_filter= 1, 2", "x"}).local_ranks_filter == std::vector<int>{1, 2});
  CHECK(parse_error({"--nnodes=1:", "x"}).find("--nnodes") == 0);
  CHECK(parse_error({"--nnodes=1:2:3", "x"}).find("--nnodes") == 0);
  CHECK(parse_error({"--local_ranks_filter=0,", "x"}).find("--local_ranks_filter") == 0);
  CHECK(parse_error({"--max_restarts=1.0", "x"}).find("--max_restarts") == 0);
  CHECK(parse_error({"--shutdown_timeout=2.5", "x"}) ==
        "--shutdown_timeout: expected a non-negative integer number of seconds, got '2.5'");
  // An empty value is a value, and is checked: for example PET_MASTER_PORT=.
  CHECK(parse_error({"x"}, {{"PET_MASTER_PORT", ""}}) ==
        "PET_MASTER_PORT (--master_port): expected an integer in 0..65535, got ''");
  CHECK(parse_error({"--master_port=", "x"}) ==
        "--master_port: expected an integer in 0..65535, got ''");
  CHECK(parse_error({"x"}, {{"PET_NNODES", ""}}).rfind("PET_NNODES (--nnodes)", 0) == 0);
  CHECK(parse_error({"--tee=", "x"}).find("--tee: expected 0-3") == 0);
  CHECK(parse_error({"x"}, {{"PET_REDIRECTS", ""}}).rfind("PET_REDIRECTS (--redirects)", 0) == 0);
  CHECK(parse_error({"--rdzv_id=", "x"}) == "--rdzv_id: expected a job id, got ''");
  CHECK(parse_error({"--master_addr=", "x"}) == "--master_addr: is empty");
  const LaunchOptions none = parse_ok({"--signals_to_handle=", "x"});
  CHECK(none.signals_to_handle.empty());
  CHECK(none.warnings ==
        std::vector<std::string>{"--signals_to_handle: '' is not a signal that can be handled: not "
                                 "handled"});
  CHECK(parse_error({"--nproc_per_node=xpu", "x"}).find("xpu is not supported") !=
        std::string::npos);
  // Choices are checked from the variable too, naming it.
  CHECK(parse_error({"x"}, {{"PET_START_METHOD", "bad"}}) ==
        "PET_START_METHOD (--start_method): expected spawn, fork or forkserver, got 'bad'");
  CHECK(parse_error({"--start-method", "bad", "x"}).find("--start_method") == 0);
}

TEST_CASE("options: --event_log_handler: torchrun's built-in handlers only") {
  CHECK(parse_ok({"x"}).event_log_handler == "null");
  CHECK(parse_ok({"x"}).event_log.empty());
  CHECK(parse_ok({"--event_log_handler=null", "x"}).event_log.empty());
  CHECK(parse_ok({"--event_log_handler=dynamic_rendezvous", "x"}).event_log.empty());
  // console: the agent's events on stderr, unless --event_log names a file.
  CHECK(parse_ok({"--event-log-handler", "console", "x"}).event_log == "/dev/stderr");
  CHECK(parse_ok({"--event-log-handler=console", "--event_log=/tmp/e", "x"}).event_log == "/tmp/e");
  CHECK(parse_error({"--event_log_handler=syslog", "x"})
            .rfind("--event_log_handler: expected console, dynamic_rendezvous or null", 0) == 0);
}

TEST_CASE("options: --logs_specs: the built-in default only, and no PET_ variable") {
  CHECK(parse_ok({"--logs_specs=default", "x"}).entrypoint == "x");
  CHECK(parse_error({"--logs-specs", "mine", "x"})
            .rfind("--logs_specs: 'mine' is not available", 0) == 0);
  CHECK(parse_ok({"x"}, {{"PET_LOGS_SPECS", "mine"}}).entrypoint == "x");
}

TEST_CASE("options: --numa_binding: torchrun's four modes, no PET_ variable") {
  CHECK(parse_ok({"x"}).numa_binding.empty());
  for (const char* mode : {"node", "socket", "exclusive", "core-complex"}) {
    CHECK(parse_ok({std::string("--numa-binding=") + mode, "x"}).numa_binding == mode);
  }
  CHECK(parse_error({"--numa_binding", "foo", "x"}) ==
        "argument --numa-binding/--numa_binding: invalid choice: 'foo' (choose from node, "
        "socket, exclusive, core-complex)");
  CHECK(parse_ok({"x"}, {{"PET_NUMA_BINDING", "node"}}).numa_binding.empty());
}

TEST_CASE("options: comma_separated_list reads as torchrun's") {
  using List = std::vector<std::string>;
  CHECK(parse_comma_separated_list("apple,orange") == List{"apple", "orange"});
  CHECK(parse_comma_separated_list("loss") == List{"loss"});
  // ",," is a comma inside an item, taken left to right as Python's str.replace does.
  CHECK(parse_comma_separated_list("a,,b,c") == List{"a,b", "c"});
  CHECK(parse_comma_separated_list("a,,,b") == List{"a,", "b"});
  CHECK(parse_comma_separated_list(",,,,") == List{",,"});
  CHECK(parse_comma_separated_list(",,,") == List{",", ""});
  CHECK(parse_comma_separated_list("a,,,,b,,") == List{"a,,b,"});
  // str.split(","): one item more than there are commas, empty ones kept, nothing trimmed.
  CHECK(parse_comma_separated_list("") == List{""});
  CHECK(parse_comma_separated_list(",") == List{"", ""});
  CHECK(parse_comma_separated_list(" a , b") == List{" a ", " b"});
  // torchrun's placeholder text given literally reads as a comma, there too.
  CHECK(parse_comma_separated_list("x<COMMA_PLACEHOLDER>y") == List{"x,y"});
}

TEST_CASE(
    "options: --duplicate_stdout_filters and --duplicate_stderr_filters from flags and PET_") {
  using List = std::vector<std::string>;
  CHECK(parse_ok({"x"}).duplicate_stdout_filters.empty());
  CHECK(parse_ok({"x"}).duplicate_stderr_filters.empty());
  auto both = parse_ok({"--duplicate-stdout-filters", "apple,orange", "--duplicate_stderr_filters",
                        "pear,,plum", "x"});
  CHECK(both.duplicate_stdout_filters == List{"apple", "orange"});
  CHECK(both.duplicate_stderr_filters == List{"pear,plum"});
  // An empty value is one empty filter, which matches every line (torchrun: ['']).
  CHECK(parse_ok({"--duplicate_stdout_filters=", "x"}).duplicate_stdout_filters == List{""});
  CHECK(parse_ok({"x"}, {{"PET_DUPLICATE_STDERR_FILTERS", ""}}).duplicate_stderr_filters ==
        List{""});
  // The variable is the default; the command line wins; each stream reads its own.
  auto from_env = parse_ok({"x"}, {{"PET_DUPLICATE_STDOUT_FILTERS", "loss,step"},
                                   {"PET_DUPLICATE_STDERR_FILTERS", "pear"}});
  CHECK(from_env.duplicate_stdout_filters == List{"loss", "step"});
  CHECK(from_env.duplicate_stderr_filters == List{"pear"});
  CHECK(
      parse_ok({"--duplicate_stdout_filters=acc", "x"}, {{"PET_DUPLICATE_STDOUT_FILTERS", "loss"}})
          .duplicate_stdout_filters == List{"acc"});
  CHECK(parse_error({"--dup", "a", "x"}).find("ambiguous option") == 0);
}

TEST_CASE("options: --shutdown_timeout, PET_SHUTDOWN_TIMEOUT, TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
  CHECK(parse_ok({"x"}).shutdown_timeout == 30);
  CHECK(parse_ok({"x"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12"}}).shutdown_timeout == 12);
  CHECK(parse_ok({"--shutdown-timeout=3", "x"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12"}})
            .shutdown_timeout == 3);
  CHECK(parse_ok({"x"}, {{"PET_SHUTDOWN_TIMEOUT", "4"}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "12"}})
            .shutdown_timeout == 4);
  // torchrun does not check the variable's sign: a negative grace period is none.
  CHECK(parse_ok({"x"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "-5"}}).shutdown_timeout == 0);
  CHECK(parse_error({"x"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}}) ==
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT: expected an integer number of seconds, got 'soon'");
  CHECK(parse_error({"--shutdown_timeout=-1", "x"}).find("non-negative") != std::string::npos);
}

TEST_CASE("options: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is read once, when parsing") {
  CHECK(parse_ok({"x"}).log_line_prefix_template.empty());
  CHECK(parse_ok({"x"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]"}})
            .log_line_prefix_template == "[${rank}]");
}

TEST_CASE("options: the single-node rule of PyTorch main (static, no endpoint, no port)") {
  auto single = parse_ok({"--rdzv_id=job", "x"});
  CHECK(single.standalone);
  CHECK(single.rdzv_backend == "c10d");
  CHECK(single.rdzv_endpoint == "localhost:0");
  // Any of these keeps the static rendezvous on --master_addr:--master_port.
  for (const auto& args : std::vector<std::vector<std::string>>{{"--master_port=29501", "x"},
                                                                {"--nnodes=1:2", "x"},
                                                                {"--nnodes=2", "x"},
                                                                {"--rdzv_endpoint=h:5", "x"}}) {
    INFO(args.front());
    auto o = parse_ok(args);
    CHECK_FALSE(o.standalone);
    CHECK(o.rdzv_backend == "static");
  }
  CHECK_FALSE(parse_ok({"x"}, {{"PET_MASTER_PORT", "29501"}}).standalone);
  CHECK_FALSE(parse_ok({"--rdzv_backend=c10d", "--rdzv_endpoint=h:1", "x"}).standalone);
  // --standalone overrides a backend and endpoint given with it, as torchrun does.
  auto standalone = parse_ok({"--standalone", "--rdzv_backend=etcd", "--rdzv_endpoint=e:1", "x"});
  CHECK(standalone.rdzv_backend == "c10d");
  CHECK(standalone.rdzv_endpoint == "localhost:0");
}

TEST_CASE("options: rendezvous endpoints as generators write them") {
  // c10d: port 0 is a free port chosen by the hosting agent, on a single node.
  for (const char* endpoint :
       {"host:0", "localhost:0", "[::1]:29400", "[::1]", "host", "[::1]:0"}) {
    INFO(endpoint);
    auto o = parse_ok({"--rdzv_backend=c10d", std::string("--rdzv_endpoint=") + endpoint, "x"});
    CHECK(o.rdzv_endpoint == endpoint);
  }
  CHECK(parse_rdzv_endpoint("host:0", 29400).value().port == 0);
  CHECK(parse_rdzv_endpoint("host:0", 29400).value().host == "host");
  CHECK(parse_rdzv_endpoint(" localhost:0 ", 29400).value().host == "localhost");
  CHECK(parse_rdzv_endpoint("[::1]:0", 29400).value().host == "::1");
  CHECK(parse_rdzv_endpoint("[::1]:0", 29400).value().port == 0);
  CHECK(parse_rdzv_endpoint("[::1]", 29400).value().port == 29400);
  CHECK(parse_rdzv_endpoint("host", 29400).value().port == 29400);  // a missing port
  CHECK(parse_rdzv_endpoint("host:10", 29400).value().port == 10);
  CHECK_FALSE(parse_rdzv_endpoint(":0", 29400));
  CHECK_FALSE(parse_rdzv_endpoint(":", 29400));
  CHECK_FALSE(parse_rdzv_endpoint("0", 29400).value().port == 0);
  CHECK_FALSE(parse_rdzv_endpoint("::0", 29400));
  CHECK(parse_error({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=host:0", "x"})
            .rfind("--rdzv_endpoint: port 0 (the host picks a free port) works on one node", 0) ==
        0);
  CHECK(parse_error({"--rdzv_backend=c10d", "--rdzv_endpoint=::1", "x"}).find("in brackets") !=
        std::string::npos);
  CHECK(parse_error({"--rdzv_backend=c10d", "--rdzv_endpoint=h:x", "x"}).find("--rdzv_endpoint") ==
        0);
  // static: the endpoint is node rank 0's HOST:PORT, over --master_addr and --master_port.
  auto fixed = parse_ok({"--nnodes=2", "--rdzv_endpoint=[fe80::1]:5000", "--master_port=7", "x"});
  CHECK(fixed.master_addr == "fe80::1");
  CHECK(fixed.master_port == 5000);
  CHECK(parse_error({"--nnodes=2", "--rdzv_endpoint=node0", "x"}) ==
        "--rdzv_endpoint: the static backend needs a port (HOST:PORT), got 'node0'");
  CHECK(parse_error({"--nnodes=2", "--master_port=0", "x"}).find("--master_port: port 0") == 0);
}

TEST_CASE("options: --slurm reads PET_SLURM too") {
  CHECK(parse_error({"x"}, {{"PET_SLURM", "1"}}).find("SLURM") != std::string::npos);
  CHECK(parse_error({"--slurm", "x"}).find("SLURM") != std::string::npos);
  CHECK(parse_error({"--standalone", "--sl", "x"}) ==
        "--slurm and --standalone cannot be used together");
}

TEST_CASE("options: help and version by abbreviation, before any script") {
  CHECK(parse_launch_options({"--h"}, env_of({})).value().outcome == ParseOutcome::kHelp);
  CHECK(parse_launch_options({"-h", "--frobnicate"}, env_of({})).value().outcome ==
        ParseOutcome::kHelp);
  CHECK(parse_launch_options({"--vers"}, env_of({})).value().outcome == ParseOutcome::kVersion);
  auto help = parse_launch_options({"--help"}, env_of({})).value().text;
  for (const char* name : {"--nproc-per-node", "--virtual_local_rank", "--numa-binding", "-m, "})
    CHECK(help.find(name) != std::string::npos);
  // The script's own --help is the script's.
  CHECK(parse_ok({"train.py", "--help"}).script_args == std::vector<std::string>{"--help"});
}

TEST_CASE("options: --rdzv_conf timeout is etcd-v1's join timeout, ignored when not a number") {
  CHECK(parse_ok({"--rdzv_conf=timeout=42", "x"}).rdzv_conf.join_timeout == 42);
  CHECK(parse_ok({"--rdzv_conf=timeout=42,join_timeout=7", "x"}).rdzv_conf.join_timeout == 7);
  // torch's own launcher test writes the quotes into the value; torchrun's c10d ignores it.
  auto o = parse_ok({"--rdzv_conf='join_timeout=5,last_call_timeout=1,timeout=5'", "x"});
  CHECK(o.rdzv_conf.join_timeout == 600);
  CHECK(o.rdzv_conf.last_call_timeout == 1);
  CHECK(o.rdzv_conf.ignored_keys == std::vector<std::string>{"'join_timeout", "timeout"});
}

TEST_CASE("options: --hostfile and --hosts make this ctrun the launcher of every host") {
  auto o = parse_ok({"--hostfile",
                     "hosts",
                     "--include=a:0@b",
                     "--ssh",
                     "ssh -i k",
                     "--ssh-port",
                     "2222",
                     "--forward-env",
                     "A,B_*",
                     "--env_file",
                     "e",
                     "--dry-run",
                     "--remote_ctrun",
                     "/opt/ctrun",
                     "--nproc_per_node",
                     "2",
                     "-r",
                     "3",
                     "x.py",
                     "--y"});
  REQUIRE(o.cluster);
  const ClusterOptions& c = *o.cluster;
  CHECK(c.hostfile == "hosts");
  CHECK(c.include == "a:0@b");
  CHECK(c.ssh == "ssh -i k");
  CHECK(c.ssh_port == 2222);
  CHECK(c.forward_env == std::vector<std::string>{"A", "B_*"});
  CHECK(c.env_file == "e");
  CHECK(c.dry_run);
  CHECK(c.remote_ctrun == "/opt/ctrun");
  CHECK(c.nproc_given);
  CHECK_FALSE(c.nnodes_given);
  CHECK(o.rdzv_backend == "c10d");  // the launcher hosts it
  // What the agents get as given, in one spelling; what the launcher sets per host is left out.
  CHECK(c.agent_args == std::vector<std::string>{"--redirects=3", "x.py", "--y"});
  CHECK_FALSE(parse_ok({"--standalone", "x.py"}).cluster);
}

TEST_CASE("options: what --hostfile cannot go with, and its options without it, are errors") {
  CHECK(parse_error({"--hostfile", "h", "--hosts", "a", "x"}) ==
        "--hostfile and --hosts cannot be used together");
  CHECK(parse_error({"--hosts", "a", "--standalone", "x"}) ==
        "--standalone and --hosts cannot be used together");
  CHECK(parse_error({"--hosts", "a", "--node_rank", "1", "x"}) ==
        "--node_rank: with --hosts the rendezvous assigns node ranks (leave it out)");
  CHECK(parse_error({"--hosts", "a", "--rdzv_backend", "static", "x"})
            .find("--rdzv_backend=static: with --hosts the rendezvous is c10d") == 0);
  CHECK(parse_error({"--hosts", "a", "--rdzv_backend", "etcd", "x"}) ==
        "--rdzv_backend=etcd needs --rdzv_endpoint (the etcd endpoints every host reaches)");
  CHECK(
      parse_error({"--hosts", "a", "--rdzv_conf", "is_host=1", "x"}).find("--rdzv_conf: is_host") ==
      0);
  CHECK(parse_error({"--hosts", "a", "--ssh_port", "0", "x"}) ==
        "--ssh_port: expected a port in 1..65535, got '0'");
  CHECK(parse_error({"--hosts", "a", "--forward_env", "A,1B", "x"}) ==
        "--forward_env: expected variable names or prefixes like NCCL_*, got 'A,1B'");
  CHECK(parse_error({"--hosts", "a", "--stop_on_stdin_close", "x"}) ==
        "--stop_on_stdin_close is for the agents --hosts starts");
  CHECK(parse_error({"--include", "a", "x"}) == "--include goes with --hostfile or --hosts");
  CHECK(parse_error({"--dry_run", "x"}) == "--dry_run goes with --hostfile or --hosts");
  // ctrun's later options are never abbreviations: torchrun's "--h" stays --help, "--re"
  // --redirects.
  CHECK(parse_error({"--hostf", "h", "x"}) == "unrecognized arguments: --hostf");
  CHECK(parse_ok({"--re", "3", "--standalone", "x"}).redirects.all == 3);
  CHECK(parse_ok({"--stop_on_stdin_close", "--standalone", "x"}).stop_on_stdin_close);
}

TEST_CASE("options: --faults and --fault_report") {
  auto o = parse_ok(
      {"--standalone", "--faults", "kill:rank=0,after=1", "--fault_report", "r.json", "x"});
  CHECK(o.faults == "kill:rank=0,after=1");
  CHECK(o.fault_report == "r.json");
  // Without a plan: the clean run's report (its results, to compare a faulted run with).
  CHECK(parse_ok({"--standalone", "--fault_report", "r", "x"}).fault_report == "r");
  CHECK(parse_error({"--standalone", "--faults=", "x"}) ==
        "--faults: expected a plan file, an inline plan or random:...");
}

TEST_CASE("options: TORCHELASTIC_HEALTH_CHECK_PORT is read as torch's int() reads it") {
  for (const char* text : {"8080", " 8080\n", "+8080", "8_080", "08080"}) {
    CHECK(ctrun::launcher::health_check_port(text) == std::optional<std::uint16_t>(8080));
  }
  for (const char* text : {"", "0", "-1", "65536", "http", "80 80", "8__080"}) {
    CHECK_FALSE(ctrun::launcher::health_check_port(text).has_value());
  }
}

TEST_CASE("options: the straggler flags, their defaults and their bad values") {
  auto o = parse_ok({"x"});
  CHECK_FALSE(o.straggler_factor.has_value());
  CHECK(o.straggler_window == 50);
  CHECK(o.straggler_interval == 5);
  o = parse_ok(
      {"--straggler-factor=1.5", "--straggler_window", "20", "--straggler_interval=0.5", "x"});
  CHECK(o.straggler_factor == 1.5);
  CHECK(o.straggler_window == 20);
  CHECK(o.straggler_interval == 0.5);
  CHECK(parse_ok({"--straggler_factor=0", "x"}).straggler_factor == 0);
  CHECK(parse_error({"--straggler_factor=1", "x"}) ==
        "--straggler_factor: expected 0 (off) or a factor above 1, got '1'");
  CHECK(parse_error({"--straggler_window=1", "x"}) ==
        "--straggler_window: expected a number of steps from 2 to 1000000, got '1'");
  CHECK(parse_error({"--straggler_interval=0", "x"}) ==
        "--straggler_interval: expected a positive number of seconds, got '0'");
  CHECK(parse_error({"--straggler_interval=inf", "x"}) ==
        "--straggler_interval: expected at most 86400 seconds, got 'inf'");
}

TEST_CASE("options: the health check flags, their defaults and their bad values") {
  auto o = parse_ok({"x"});
  CHECK(o.health_check.empty());
  CHECK(o.health_check_interval == 30);
  CHECK(o.health_check_timeout == 60);
  CHECK(o.health_min_free_mib == 100);
  CHECK(o.health_check_dirs.empty());
  o = parse_ok({"--health_check", "nvidia-smi -L", "--health-check-interval=2",
                "--health_check_timeout=5", "--health_min_free_mib=0",
                "--health_check_dirs=/ckpt, /scratch", "x"});
  CHECK(o.health_check == "nvidia-smi -L");
  CHECK(o.health_check_interval == 2);
  CHECK(o.health_check_timeout == 5);
  CHECK(o.health_min_free_mib == 0);
  CHECK(o.health_check_dirs == std::vector<std::string>{"/ckpt", "/scratch"});
  CHECK(parse_error({"--health_check=", "x"}) == "--health_check: expected a command, got ''");
  CHECK(parse_error({"--health_check_interval=0", "x"}) ==
        "--health_check_interval: expected a positive number of seconds, got '0'");
  CHECK(parse_error({"--health_check_timeout=1e9", "x"}) ==
        "--health_check_timeout: expected at most 86400 seconds, got '1e9'");
  CHECK(parse_error({"--health_min_free_mib=-1", "x"}) ==
        "--health_min_free_mib: expected a non-negative number of MiB, got '-1'");
  CHECK(parse_error({"--health_check_dirs=,", "x"}) ==
        "--health_check_dirs: expected directories, comma-separated, got ','");
}

TEST_CASE("options: the hang report flags, their defaults and their bad values") {
  auto o = parse_ok({"x"});
  CHECK(o.hang_report_timeout == 15);
  CHECK_FALSE(o.flight_recorder);
  o = parse_ok({"--hang-report-timeout=0", "--flight_recorder", "x"});
  CHECK(o.hang_report_timeout == 0);
  CHECK(o.flight_recorder);
  CHECK(parse_error({"--hang_report_timeout=-1", "x"}) ==
        "--hang_report_timeout: expected a non-negative number of seconds, got '-1'");
  CHECK(parse_error({"--hang_report_timeout=7200", "x"}) ==
        "--hang_report_timeout: expected at most 3600 seconds, got '7200'");
}
