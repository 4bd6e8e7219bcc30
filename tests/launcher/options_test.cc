#include "ctrun/launcher/options.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <map>

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
  CHECK(o.rdzv_backend == "static");
  CHECK(o.rdzv_id == "none");
  CHECK(o.max_restarts == 0);
  CHECK(o.monitor_interval == 5);
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
    const std::string value = underscore == "--rdzv_backend" ? "c10d" : "1";
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
  CHECK(parse_error({"--signals_to_handle=SIGFOO", "x"}).find("SIGFOO") != std::string::npos);
  CHECK(parse_error({"--signals_to_handle=SIGKILL", "x"}).find("SIGKILL") != std::string::npos);
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
