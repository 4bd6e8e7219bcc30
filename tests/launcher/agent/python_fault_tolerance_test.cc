// Per-step fault tolerance for Python scripts: tests/python/ft_mlp.py (ctrun_worker's
// FaultTolerance and StepSampler, torch 1.13 here, Gloo) under ctrun --fault_tolerance=step, as
// processes: a worker SIGKILLed or hung mid-step, on ctrund and on etcd, a node lost, a node
// joining, the daemon restarted, a random --faults plan with its --fault_report; and a job
// resumed from the script's own checkpoint. Each run asserts
// what the mode promises, as for the C++ trainers (tests/trainers/fault_tolerant_test.cc): the
// survivors keep their processes, no committed step is lost or redone, every sample of each epoch
// is trained exactly once, and every replica ends with the very same parameters.
#include <csignal>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "catch.h"
#include "ctrun/rendezvous/json.h"
#include "etcd_server.h"
#include "ft_checks.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// ft_mlp.py for 2 epochs of `samples` (batch 32 per replica, seed 7) with the tests' timeouts
// (collective 1 s, heartbeat 0.5 s, join 3 s, quorum 30 s), logging its commits to `consumed`.
std::vector<std::string> ft_script(std::uint64_t samples, const std::string& consumed,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {FT_SCRIPT_PATH, "--samples", std::to_string(samples),
                                   "--consumed_log", consumed};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

struct Fault {
  const char* name;
  const char* flag;
  const char* worker_timeout;
  const char* seen;
  const char* at_step;
  std::uint64_t samples;
  const char* step_sleep_ms;  // a floor under each step's time
};
// Early in a run of 384 steps of at least 10 ms (about 4 s: Python's steps here take about
// 8 ms, and a replacement needs seconds to import torch on a busy machine), so that the
// replacement heals and trains on; the hang's replacement may come after the end.
const Fault kKilled{
    "killed", "--kill_at_step", "--worker_timeout=0", "was killed by SIGKILL", "3", 12288, "10"};
const Fault kHung{"hung", "--hang_at_step", "--worker_timeout=12", "no heartbeat for ", "10", 1536,
                  "0"};

// One node of three Python workers on the rendezvous `rendezvous` names, the last one faulty:
// the job succeeds with the promises kept.
void check_worker_fault(const ScratchDir& s, const Fault& f,
                        const std::vector<std::string>& rendezvous) {
  const std::string consumed = s.path(std::string(f.name) + ".consumed");
  const std::string log = s.path(std::string(f.name) + ".log");
  std::vector<std::string> argv = {CTRUN_PATH};
  argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
  argv.insert(argv.end(), {"--nproc_per_node=3", "--fault_tolerance=step", "--max_restarts=2",
                           f.worker_timeout});
  const auto script =
      ft_script(f.samples, consumed, {f.flag, f.at_step, "--step_sleep_ms", f.step_sleep_ms});
  argv.insert(argv.end(), script.begin(), script.end());
  ChildProcess p(argv, log);
  const auto rc = p.wait(150s);
  const std::string out = read_file(log);
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(out.find(f.seen) != std::string::npos);
  CHECK(out.find("replacing worker rank 2 (local rank 2; 1 of 2 restarts); the others run on") !=
        std::string::npos);
  CHECK(out.find("restarting the job") == std::string::npos);

  check_replaced_worker(out, 3, 2);
  check_commits(read_consumed(consumed), f.samples);
  if (std::string(f.name) == "killed") {
    CHECK(out.find("healed from ") != std::string::npos);
    CHECK(out.find("lost: ") != std::string::npos);  // the survivors lost the step it died in
  }
}

// One agent (one Python worker) of a multi-node job at `endpoint`, logging to DIR/NAME.log.
std::unique_ptr<ChildProcess> ft_agent(const ScratchDir& s, const std::string& name,
                                       const std::string& nnodes, const std::string& endpoint,
                                       const std::string& conf, const std::string& consumed,
                                       std::uint64_t samples) {
  return std::make_unique<ChildProcess>(ft_agent_argv(CTRUN_PATH, nnodes, endpoint, "py-ft-agents",
                                                      conf, ft_script(samples, consumed)),
                                        s.path(name + ".log"));
}

std::string logs_of(const ScratchDir& s, const std::vector<std::string>& names) {
  std::string all;
  for (const auto& name : names) {
    all += "---- " + name + " ----\n" + read_file(s.path(name + ".log"));
  }
  return all;
}

// Three agents (one Python worker each) of a 2:3 job on the rendezvous `rendezvous` names
// (its flags); the first hosts it where it can. c is the node lost: its agent SIGKILLed after 20
// committed steps, its worker dying with it and the worker's proxy with the worker, as on a dead
// machine. a and b finish in their first processes with the promises kept.
void check_node_lost(const ScratchDir& s, const std::vector<std::string>& rendezvous) {
  const std::string consumed = s.path("consumed");
  const std::uint64_t samples = 6144;
  auto agent = [&](const std::string& name) {
    std::vector<std::string> argv = {CTRUN_PATH, "--nnodes=2:3", "--nproc_per_node=1"};
    argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
    argv.insert(argv.end(), {"--fault_tolerance=step", "--max_restarts=0"});
    const auto script = ft_script(samples, consumed);
    argv.insert(argv.end(), script.begin(), script.end());
    return std::make_unique<ChildProcess>(argv, s.path(name + ".log"));
  };
  auto a = agent("a");
  if (rendezvous.front() == "--rdzv_backend=c10d") {
    REQUIRE(wait_for_text(s.path("a.log"), "hosting the rendezvous", 30s));
  }
  auto b = agent("b");
  auto c = agent("c");
  REQUIRE(wait_for_lines(consumed, 3 * 20, 90s));  // 20 steps committed by each of the three
  c->signal(SIGKILL);
  const auto c_code = c->wait(30s);
  const auto a_code = a->wait(120s);
  const auto b_code = b->wait(60s);
  INFO(logs_of(s, {"a", "b", "c"}));
  REQUIRE(c_code);
  CHECK(*c_code == 128 + SIGKILL);
  REQUIRE(a_code);
  REQUIRE(b_code);
  CHECK(*a_code == 0);
  CHECK(*b_code == 0);
  auto lines = replica_lines(read_file(s.path("a.log")));
  const auto lines_b = replica_lines(read_file(s.path("b.log")));
  REQUIRE(lines.size() == 1);
  REQUIRE(lines_b.size() == 1);
  lines.insert(lines_b.begin(), lines_b.end());
  check_kept_processes(lines);
  check_commits(read_consumed(consumed), samples);
}

}  // namespace

TEST_CASE("python fault tolerance: StepSampler trains each sample once, in torch's order") {
  ScratchDir s("py_ft_sampler");
  // tests/python/step_sampler_check.py asserts, with ctrun's helper on its path (env(1) sets it).
  ChildProcess check({"/usr/bin/env", std::string("PYTHONPATH=") + CTRUN_PYTHON_HELPER_DIR,
                      "/usr/bin/python3", SAMPLER_CHECK_PATH},
                     s.path("check.log"));
  const auto rc = check.wait(60s);
  const std::string out = read_file(s.path("check.log"));
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(out.find("ok\n") != std::string::npos);
}

TEST_CASE("python fault tolerance: a killed or hung worker costs a step, not a restart") {
  ScratchDir s("py_ft");
  SystemPython python;
  for (const Fault& f : {kKilled, kHung}) check_worker_fault(s, f, {"--standalone"});
}

TEST_CASE("python fault tolerance: on etcd a killed or hung worker costs a step, not a restart") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("py_ft_etcd");
  SystemPython python;
  EtcdCluster etcd(s, 1);
  // The replicas keep the quorum on etcd keys; a dead one is let go when its lease (the 0.5 s
  // heartbeat timeout, as etcd grants it) expires.
  for (const Fault& f : {kKilled, kHung}) {
    check_worker_fault(s, f,
                       {"--nnodes=1", "--rdzv_backend=etcd", "--rdzv_endpoint=" + etcd.endpoints(),
                        "--rdzv_id=py-ft-etcd-" + std::string(f.name)});
  }
}

TEST_CASE("python fault tolerance: a node lost costs a step, the others go on") {
  ScratchDir s("py_ft_agents");
  SystemPython python;
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  check_node_lost(s,
                  {"--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint, "--rdzv_id=py-ft-agents"});
}

TEST_CASE("python fault tolerance: on etcd a node lost costs a step, the others go on") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("py_ft_agents_etcd");
  SystemPython python;
  EtcdCluster etcd(s, 1);
  // The lost node's replica goes when its quorum lease (the 0.5 s heartbeat timeout, as etcd
  // grants it) expires, its agent when its rendezvous lease does.
  check_node_lost(s, {"--rdzv_backend=etcd", "--rdzv_endpoint=" + etcd.endpoints(),
                      "--rdzv_id=py-ft-lost-etcd"});
}

TEST_CASE("python fault tolerance: a node that joins heals and trains, nobody stops") {
  ScratchDir s("py_ft_join");
  SystemPython python;
  const std::string consumed = s.path("consumed");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  // Long enough (768 steps of two replicas) that the third node, seconds to start, comes while
  // the first two train.
  const std::uint64_t samples = 24576;
  auto agent = [&](const std::string& name) {
    return ft_agent(s, name, "2:3", endpoint, "last_call_timeout=1", consumed, samples);
  };
  auto a = agent("a");
  REQUIRE(wait_for_text(s.path("a.log"), "hosting the rendezvous", 30s));
  auto b = agent("b");
  REQUIRE(wait_for_lines(consumed, 2 * 20, 90s));
  auto c = agent("c");
  const auto a_code = a->wait(180s);
  const auto b_code = b->wait(60s);
  const auto c_code = c->wait(60s);
  const std::string out_c = read_file(s.path("c.log"));
  INFO(logs_of(s, {"a", "b", "c"}));
  REQUIRE(a_code);
  REQUIRE(b_code);
  REQUIRE(c_code);
  CHECK(*a_code == 0);
  CHECK(*b_code == 0);
  CHECK(*c_code == 0);
  check_node_joined(read_file(s.path("a.log")), read_file(s.path("b.log")), out_c, consumed,
                    samples);
}

TEST_CASE("python fault tolerance: ctrund SIGKILLed and restarted with --state_dir") {
  ScratchDir s("py_ft_daemon");
  SystemPython python;
  const std::string consumed = s.path("consumed");
  const std::vector<std::string> state = {"--state_dir", s.path("state")};
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH, state, 0, "ctrund1");
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::uint64_t samples = 12288;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (const char* name : {"a", "b", "c"}) {
    agents.push_back(
        ft_agent(s, name, "3", endpoint, "is_host=false,keep_alive_interval=1", consumed, samples));
  }
  REQUIRE(wait_for_lines(consumed, 3 * 20, 90s));
  daemon->signal(SIGKILL);
  REQUIRE(daemon->wait(5s).has_value());
  const long committed_at_kill = lines_in(consumed);
  std::this_thread::sleep_for(1s);
  start_ctrund(daemon, s, CTRUND_PATH, state, port, "ctrund2");
  std::vector<std::optional<int>> codes;
  for (auto& agent : agents) codes.push_back(agent->wait(180s));
  const std::string all = logs_of(s, {"a", "b", "c"});
  INFO(all << "---- ctrund2 ----\n" << read_file(s.path("ctrund2.log")));
  for (const auto& code : codes) {
    REQUIRE(code);
    CHECK(*code == 0);
  }
  // The job trained on after the daemon came back, every worker in its first process.
  CHECK(lines_in(consumed) > committed_at_kill + 3 * 10);
  const auto lines = replica_lines(all);
  REQUIRE(lines.size() == 3);
  check_kept_processes(lines);
  check_commits(read_consumed(consumed), samples);
}

TEST_CASE(
    "python fault tolerance: a random plan of five faults loses no step, the report says so") {
  ScratchDir s("py_ft_faults");
  SystemPython python;
  // Kills, SIGTERMs, exceptions (raised by report_step() in should_commit()) and one-second
  // hangs at steps drawn from the seed; each worker that ends is replaced alone and heals.
  std::vector<std::string> argv = {
      CTRUN_PATH,
      "--standalone",
      "--nproc_per_node=3",
      "--fault_tolerance=step",
      "--max_restarts=8",
      "--faults",
      "random:seed=21,count=5,kinds=kill+term+exception+hang,ranks=0-2,steps=5-150,duration=1",
      "--fault_report",
      s.path("report.json")};
  // Steps of at least 20 ms (about 8 s in all), so that the replacements have time to join.
  const auto script = ft_script(12288, s.path("consumed"), {"--step_sleep_ms", "20"});
  argv.insert(argv.end(), script.begin(), script.end());
  ChildProcess job(argv, s.path("job.log"));
  const auto rc = job.wait(300s);
  const std::string log = read_file(s.path("job.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(count_of(log, "ctrun: injecting fault ") == 5);
  CHECK(log.find("replacing worker rank ") != std::string::npos);
  CHECK(log.find("restarting the job") == std::string::npos);  // nobody else stopped
  // A replacement started after the others finished (a late fault, Python's seconds to start on
  // a busy machine) learns that nothing is left and writes no result.
  const std::size_t results = check_fault_tolerant_report(s.path("report.json"));
  REQUIRE(results >= 2);
  if (results < 3) {
    CHECK(log.find("the other replicas finished the training at step") != std::string::npos);
  }
  check_commits(read_consumed(s.path("consumed")), 12288);
}

TEST_CASE("python fault tolerance: checkpoints work beside it, a job resumes from one") {
  ScratchDir s("py_ft_resume");
  SystemPython python;
  const std::string consumed = s.path("consumed");
  const std::uint64_t samples = 1536;  // 16 steps of 3 x 32 per epoch, 32 in two epochs
  auto run = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {CTRUN_PATH, "--standalone", "--nproc_per_node=3",
                                     "--fault_tolerance=step"};
    std::vector<std::string> script = ft_script(
        samples, consumed, {"--checkpoint", s.path("ckpt.pt"), "--checkpoint_every", "4"});
    script.insert(script.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), script.begin(), script.end());
    ChildProcess job(argv, s.path(name + ".log"));
    const auto rc = job.wait(120s);
    const std::string out = read_file(s.path(name + ".log"));
    INFO(out);
    REQUIRE(rc);
    CHECK(*rc == 0);
    return out;
  };
  // The first job stops at step 20 (a checkpoint, in the second epoch); the second resumes there.
  const std::string first = run("first", {"--max_steps", "20"});
  CHECK(first.find("resumed") == std::string::npos);
  const std::string second = run("second", {});
  CHECK(count_of(second, "resumed from the checkpoint at step 20") == 3);
  const auto lines = replica_lines(second);
  REQUIRE(lines.size() == 3);
  check_kept_processes(lines);
  // Steps 1-20 from the first job and 21 on from the second (its replicas, new ids): none
  // missing or done twice, and each sample of both epochs trained once across the two jobs.
  // The last step is 32 when every quorum held all three replicas; under load a replica that
  // asks late sits a step out (a quorum of two, a smaller step), and the epochs take a step more.
  const auto commits = read_consumed(consumed);
  REQUIRE(commits.size() == 6);
  std::set<std::int64_t> first_steps;
  std::set<std::int64_t> last_steps;
  for (const auto& [replica, r] : lines) {
    INFO(replica);
    REQUIRE(commits.count(replica) == 1);
    const auto& steps = commits.at(replica);
    first_steps.insert(steps.begin()->first);
    last_steps.insert(steps.rbegin()->first);
  }
  CHECK(*first_steps.begin() == 21);  // the second job goes on right after the checkpoint
  CHECK(*first_steps.rbegin() <= 22);
  REQUIRE(last_steps.size() == 1);  // the three finish together
  CHECK(*last_steps.begin() >= 32);
  check_commits(commits, samples);
}
