#include "ctrun/launcher/slurm.h"

#include <map>

#include "catch.h"
#include "fake_env.h"

using namespace ctrun::launcher;

using ctrun::testing::env_of;

namespace {

std::vector<std::string> hosts(const std::string& text) {
  auto r = expand_hostlist(text, "SLURM_JOB_NODELIST");
  INFO((r ? "" : r.error().message));
  REQUIRE(r.ok());
  return r.value();
}

std::string hostlist_error(const std::string& text) {
  auto r = expand_hostlist(text, "SLURM_JOB_NODELIST");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

// The variables srun sets for a task on node `node_id` of a step.
std::map<std::string, std::string> step_env(const std::string& nodelist, int nnodes, int node_id) {
  return {{"SLURM_JOB_ID", "4242"},          {"SLURM_NNODES", std::to_string(nnodes)},
          {"SLURM_JOB_NODELIST", nodelist},  {"SLURM_STEP_NUM_NODES", std::to_string(nnodes)},
          {"SLURM_STEP_NODELIST", nodelist}, {"SLURM_NODEID", std::to_string(node_id)}};
}

LaunchOptions parse_ok(std::vector<std::string> args, std::map<std::string, std::string> env) {
  auto r = parse_launch_options(args, env_of(env));
  INFO((r ? "" : r.error().message));
  REQUIRE(r.ok());
  return r.value().options;
}

std::string parse_error(std::vector<std::string> args, std::map<std::string, std::string> env) {
  auto r = parse_launch_options(args, env_of(env));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("slurm hostlist: plain names and commas") {
  CHECK(hosts("node1") == std::vector<std::string>{"node1"});
  CHECK(hosts("a,b,c") == std::vector<std::string>{"a", "b", "c"});
  CHECK(hosts("n1.cluster.local,n2.cluster.local") ==
        std::vector<std::string>{"n1.cluster.local", "n2.cluster.local"});
}

TEST_CASE("slurm hostlist: ranges keep the zero padding of their first bound") {
  CHECK(hosts("gpu[01-04,07],cpu3") ==
        std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"});
  CHECK(hosts("n[8-11]") == std::vector<std::string>{"n8", "n9", "n10", "n11"});
  CHECK(hosts("n[098-101]") == std::vector<std::string>{"n098", "n099", "n100", "n101"});
  CHECK(hosts("n[5]") == std::vector<std::string>{"n5"});
}

TEST_CASE("slurm hostlist: several bracket groups in one name multiply out") {
  CHECK(hosts("rack[1-2]-n[08-09]") ==
        std::vector<std::string>{"rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"});
  CHECK(hosts("a[1-2]b,c[3,5]d.x") == std::vector<std::string>{"a1b", "a2b", "c3d.x", "c5d.x"});
}

TEST_CASE("slurm hostlist: malformed lists name what is wrong") {
  CHECK_THAT(hostlist_error("gpu[01-04"), Catch::Matchers::ContainsSubstring("unclosed '['"));
  CHECK_THAT(hostlist_error("gpu01]"), Catch::Matchers::ContainsSubstring("unmatched ']'"));
  CHECK_THAT(hostlist_error("gpu[4-1]"), Catch::Matchers::ContainsSubstring("runs backwards"));
  CHECK_THAT(hostlist_error("gpu[a-b]"), Catch::Matchers::ContainsSubstring("'a-b'"));
  CHECK_THAT(hostlist_error("gpu[1-]"), Catch::Matchers::ContainsSubstring("not a number"));
  CHECK_THAT(hostlist_error("a,,b"), Catch::Matchers::ContainsSubstring("empty host name"));
  CHECK_THAT(hostlist_error(""), Catch::Matchers::ContainsSubstring("empty host name"));
  CHECK_THAT(hostlist_error("n[[1]]"), Catch::Matchers::ContainsSubstring("nested"));
  CHECK_THAT(hostlist_error("n[1-999999999]"), Catch::Matchers::ContainsSubstring("more than"));
  CHECK_THAT(hostlist_error("n[1-999]x[1-999]"), Catch::Matchers::ContainsSubstring("more than"));
  CHECK_THAT(hostlist_error("a b"), Catch::Matchers::ContainsSubstring("white space"));
  CHECK_THAT(hostlist_error("n[]"), Catch::Matchers::ContainsSubstring("SLURM_JOB_NODELIST"));
}

TEST_CASE("slurm: the rendezvous port follows the job id and avoids torch's 29500") {
  CHECK(slurm_rendezvous_port("17") == 29417);
  CHECK(slurm_rendezvous_port("123456") == 29400 + 3456);
  CHECK(slurm_rendezvous_port("100") == 39500);
  CHECK(slurm_rendezvous_port("9999") == 39399);
}

TEST_CASE("slurm --slurm: nodes, rank, endpoint, run id and host role come from the step") {
  auto o = parse_ok({"--slurm", "train"}, step_env("gpu[01-04,07]", 5, 2));
  CHECK(o.min_nodes == 5);
  CHECK(o.max_nodes == 5);
  CHECK(o.node_rank == 2);
  CHECK(o.node_rank_given);
  CHECK(o.rdzv_backend == "c10d");
  CHECK(o.rdzv_endpoint == "gpu01:" + std::to_string(slurm_rendezvous_port("4242")));
  CHECK(o.rdzv_id == "4242");
  REQUIRE(o.rdzv_conf.is_host.has_value());
  CHECK_FALSE(*o.rdzv_conf.is_host);
  CHECK(o.nproc_per_node == "1");

  auto first = parse_ok({"--slurm", "train"}, step_env("gpu[01-04,07]", 5, 0));
  REQUIRE(first.rdzv_conf.is_host.has_value());
  CHECK(*first.rdzv_conf.is_host);
}

TEST_CASE("slurm --slurm: the worker count is the node's GPUs") {
  auto env = step_env("n1", 1, 0);
  env["SLURM_GPUS_ON_NODE"] = "4";
  CHECK(parse_ok({"--slurm", "train"}, env).nproc_per_node == "4");
  env.erase("SLURM_GPUS_ON_NODE");
  env["CUDA_VISIBLE_DEVICES"] = "0,1,2";
  CHECK(parse_ok({"--slurm", "train"}, env).nproc_per_node == "3");
  CHECK(parse_ok({"--slurm", "--nproc_per_node", "2", "train"}, env).nproc_per_node == "2");
}

TEST_CASE("slurm --slurm: flags the user gave win over the allocation") {
  auto env = step_env("n[1-4]", 4, 3);
  auto o = parse_ok(
      {"--slurm", "--nnodes", "2:4", "--rdzv_endpoint", "etc0:1234", "--rdzv_id", "mine", "train"},
      env);
  CHECK(o.min_nodes == 2);
  CHECK(o.max_nodes == 4);
  CHECK(o.rdzv_endpoint == "etc0:1234");
  CHECK(o.rdzv_id == "mine");
  CHECK_FALSE(o.rdzv_conf.is_host.has_value());  // the endpoint's own address decides
  CHECK(o.node_rank == 3);
}

TEST_CASE("slurm --slurm with etcd keeps the given etcd endpoints and needs them") {
  auto o = parse_ok({"--slurm", "--rdzv_backend=etcd", "--rdzv_endpoint=e1:2379,e2", "train"},
                    step_env("n[1-2]", 2, 1));
  CHECK(o.rdzv_endpoint == "e1:2379,e2");
  CHECK(o.node_rank == 1);
  CHECK(o.rdzv_id == "4242");
  CHECK(parse_error({"--slurm", "--rdzv_backend=etcd-v2", "train"}, step_env("n[1-2]", 2, 1)) ==
        "--slurm with --rdzv_backend=etcd-v2 needs --rdzv_endpoint (the etcd cluster's endpoints)");
}

TEST_CASE("slurm --slurm with the static backend sets torchrun's master address and rank") {
  auto o = parse_ok({"--slurm", "--rdzv_backend", "static", "train"}, step_env("n[1-2]", 2, 1));
  CHECK(o.rdzv_backend == "static");
  CHECK(o.master_addr == "n1");
  CHECK(o.master_port == slurm_rendezvous_port("4242"));
  CHECK(o.node_rank == 1);
}

TEST_CASE("slurm --slurm: the step's node list wins over the allocation's") {
  auto env = step_env("n[1-2]", 2, 1);
  env["SLURM_NNODES"] = "8";
  env["SLURM_JOB_NODELIST"] = "n[1-8]";
  auto o = parse_ok({"--slurm", "train"}, env);
  CHECK(o.max_nodes == 2);
  // Without srun (a batch script) the allocation's variables are all there is.
  env.erase("SLURM_STEP_NUM_NODES");
  env.erase("SLURM_STEP_NODELIST");
  env["SLURM_NODEID"] = "0";
  CHECK(parse_ok({"--slurm", "train"}, env).max_nodes == 8);
}

TEST_CASE("slurm --slurm: a missing or inconsistent allocation is a clear error") {
  CHECK_THAT(parse_error({"--slurm", "train"}, {}),
             Catch::Matchers::ContainsSubstring("SLURM_JOB_ID is not set"));
  auto env = step_env("n[1-3]", 2, 0);
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("names 3 hosts but SLURM_STEP_NUM_NODES is 2"));
  env = step_env("n[1-2]", 2, 2);
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("SLURM_NODEID must be in 0..1"));
  env = step_env("n[1-2]", 2, 0);
  env["SLURM_STEP_NODELIST"] = "n[1-2";
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("SLURM_STEP_NODELIST: unclosed '['"));
  env = step_env("n1", 1, 0);
  env["SLURM_GPUS_ON_NODE"] = "two";
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("SLURM_GPUS_ON_NODE"));
  env = step_env("n1", 1, 0);
  env.erase("SLURM_NODEID");
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("SLURM_NODEID is not set"));
  CHECK_THAT(parse_error({"--slurm", "--standalone", "train"}, step_env("n1", 1, 0)),
             Catch::Matchers::ContainsSubstring("--slurm and --standalone"));
  env = step_env("n1", 1, 0);
  env["SLURM_LOCALID"] = "1";
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("run one ctrun per node"));
  env = step_env("n1", 1, 0);
  env["SLURM_GPUS_ON_NODE"] = "100000";
  CHECK_THAT(parse_error({"--slurm", "train"}, env),
             Catch::Matchers::ContainsSubstring("SLURM_GPUS_ON_NODE"));
  // PET_SLURM turns it on like the flag.
  CHECK_THAT(parse_error({"train"}, {{"PET_SLURM", "1"}}),
             Catch::Matchers::ContainsSubstring("SLURM_JOB_ID"));
}
