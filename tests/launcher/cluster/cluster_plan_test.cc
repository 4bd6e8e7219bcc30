#include "launcher/cluster/cluster_plan.h"

#include <map>

#include "catch.h"

using namespace ctrun::launcher;

namespace {

LaunchOptions parse(std::vector<std::string> args,
                    const std::map<std::string, std::string>& env = {}) {
  auto parsed =
      parse_launch_options(args, [&](const std::string& name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  if (!parsed) FAIL(parsed.error().message);
  return parsed.value().options;
}

ClusterFacts facts() {
  ClusterFacts f;
  f.cwd = "/home/u/my job";
  f.ctrun_path = "/usr/bin/ctrun";
  f.control_dir = "/tmp/ctrun-ssh-1000";
  f.job_id = "ctrun-1234";
  f.endpoint = "10.0.0.1:29400";
  return f;
}

std::vector<Host> hosts(const std::string& list) { return parse_hosts_option(list).value(); }

}  // namespace

TEST_CASE("cluster_plan: each host's agent gets the job's settings and the user's command line") {
  auto o = parse({"--hosts", "h1:4,h2:2", "--max-restarts=3", "--rdzv_conf", "join_timeout=60",
                  "--log_dir", "/logs", "train.py", "--lr", "0.1"},
                 {{"PET_MONITOR_INTERVAL", "2"}});
  REQUIRE(o.cluster);
  auto plan = plan_cluster(o, hosts("h1:4,h2:2"), facts());
  REQUIRE(plan);
  CHECK(plan.value().min_nodes == 2);
  CHECK(plan.value().max_nodes == 2);
  CHECK(plan.value().job_id == "ctrun-1234");
  REQUIRE(plan.value().hosts.size() == 2);
  const HostPlan& h2 = plan.value().hosts[1];
  CHECK(h2.nproc == "2");
  CHECK(h2.agent_argv == std::vector<std::string>{
                             "/usr/bin/ctrun", "--nnodes=2:2", "--nproc_per_node=2",
                             "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29400",
                             "--rdzv_id=ctrun-1234", "--rdzv_conf=join_timeout=60,is_host=false",
                             "--log_dir=/logs/h2", "--stop_on_stdin_close",
                             // the PET_ variable's value travels as an option
                             "--max_restarts=3", "--monitor_interval=2", "train.py", "--lr",
                             "0.1"});
  CHECK(h2.log_file == "/logs/h2.log");
  CHECK(h2.remote_command.rfind("cd '/home/u/my job' && exec /usr/bin/ctrun --nnodes=2:2 ", 0) ==
        0);
  // The user's ssh words first (ssh keeps the first value of an option), the host, the command.
  CHECK(h2.ssh_argv.front() == "ssh");
  CHECK(h2.ssh_argv[h2.ssh_argv.size() - 2] == "h2");
  CHECK(h2.ssh_argv.back() == h2.remote_command);
}

TEST_CASE("cluster_plan: the environment sent: defaults, --forward_env, env files, slots") {
  auto o =
      parse({"--hosts", "a:4,b:4", "--include", "a@b:2,3", "--forward_env", "MY_*,DATA", "--ssh",
             "ssh -i '/keys/my key' -o ConnectTimeout=3", "--ssh_port", "2222", "x.py"});
  ClusterFacts f = facts();
  f.environment = {{"NCCL_DEBUG", "INFO"}, {"HOME", "/home/u"}, {"MY_A", "it's"},
                   {"DATA", "/d"},         {"PET_NNODES", "9"}, {"DATAX", "no"}};
  f.env_file = {{"NCCL_DEBUG", "WARN"}, {"EXTRA", "1"}};
  auto picked = select_hosts(hosts("a:4,b:4"), o.cluster->include, "").value();
  auto plan = plan_cluster(o, picked, f);
  REQUIRE(plan);
  CHECK(plan.value().forwarded == std::vector<std::string>{"NCCL_DEBUG", "MY_A", "DATA", "EXTRA"});
  const HostPlan& a = plan.value().hosts[0];
  const HostPlan& b = plan.value().hosts[1];
  CHECK(a.nproc == "4");
  CHECK(a.cuda_visible_devices.empty());
  CHECK(b.nproc == "2");
  CHECK(b.cuda_visible_devices == "2,3");
  CHECK(b.remote_command.find("exec env NCCL_DEBUG=WARN 'MY_A=it'\\''s' DATA=/d EXTRA=1 "
                              "CUDA_VISIBLE_DEVICES=2,3 /usr/bin/ctrun ") != std::string::npos);
  CHECK(a.remote_command.find("CUDA_VISIBLE_DEVICES") == std::string::npos);
  CHECK(std::vector<std::string>(b.ssh_argv.begin(), b.ssh_argv.begin() + 7) ==
        std::vector<std::string>{"ssh", "-i", "/keys/my key", "-o", "ConnectTimeout=3", "-p",
                                 "2222"});
}

TEST_CASE("cluster_plan: node ranges and worker counts that do not fit are errors") {
  auto error = [](std::vector<std::string> args, const std::string& list) {
    auto plan = plan_cluster(parse(std::move(args)), hosts(list), facts());
    REQUIRE_FALSE(plan);
    return plan.error().message;
  };
  CHECK(error({"--hosts", "a,b,c", "--nnodes", "2", "x.py"}, "a,b,c") ==
        "the list has 3 hosts and --nnodes=2:2 takes at most 2");
  CHECK(error({"--hosts", "a", "--nnodes", "2:4", "x.py"}, "a") ==
        "--nnodes=2:4 needs at least 2 hosts; the list has 1");
  auto elastic =
      plan_cluster(parse({"--hosts", "a,b,c", "--nnodes", "2:3", "x.py"}), hosts("a,b,c"), facts());
  REQUIRE(elastic);
  CHECK(elastic.value().hosts[0].agent_argv[1] == "--nnodes=2:3");
  CHECK(elastic.value().hosts[0].nproc == "1");  // no slots: --nproc_per_node's default
  auto given = plan_cluster(parse({"--hosts", "a:8", "--nproc_per_node", "gpu", "x.py"}),
                            hosts("a:8"), facts());
  REQUIRE(given);
  CHECK(given.value().hosts[0].nproc == "gpu");
  auto narrowed = parse({"--hosts", "a:8", "--include", "a:0", "--nproc_per_node", "1", "x.py"});
  auto plan = plan_cluster(narrowed, select_hosts(hosts("a:8"), "a:0", "").value(), facts());
  REQUIRE_FALSE(plan);
  CHECK(plan.error().message.find("--nproc_per_node with slots picked") == 0);
  CHECK(error({"--hosts", "a", "--ssh", "ssh -o 'x", "x.py"}, "a") ==
        "--ssh: unbalanced ' in 'ssh -o 'x'");
}

TEST_CASE("cluster_plan: env files and quoting") {
  auto vars = parse_env_file("# comment\nA=1\n  export B=x y\nC=\nA=2\n", "f");
  REQUIRE(vars);
  CHECK(vars.value() == EnvVars{{"A", "2"}, {"B", "x y"}, {"C", ""}});
  CHECK(parse_env_file("A=1\n1B=2\n", "f").error().message ==
        "f:2: expected NAME=VALUE, got '1B=2'");
  CHECK(parse_env_file("just words\n", "f").error().message ==
        "f:1: expected NAME=VALUE, got 'just words'");
  CHECK(shell_quote("plain/path-1.0") == "plain/path-1.0");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b$c") == "'a b$c'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(split_command_line(R"(ssh -o "A=b c" 'd e'\ f g\"h)").value() ==
        std::vector<std::string>{"ssh", "-o", "A=b c", "d e f", "g\"h"});
}
