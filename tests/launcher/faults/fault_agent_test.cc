// ctrun --faults on real workers: each kind fires on the rank planned, within 100 ms of its
// time, through the real mechanism (a signal, SIGSTOP and SIGCONT), the agent recovers as its
// mode says, and the event log marks each fault as injected.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "catch.h"
#include "ctrun/launcher/options.h"
#include "ctrun/rendezvous/client.h"
#include "ctrun/rendezvous/json.h"
#include "etcd_server.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
using Json = ctrun::rendezvous::Json;

namespace {

std::vector<Json> events(const std::string& path) {
  std::vector<Json> out;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) out.push_back(Json::parse(line));
  return out;
}

// Milliseconds from the first event named `from` to the first named `to` (the event log's
// times).
long long ms_between(const std::vector<Json>& log, const std::string& from, const std::string& to) {
  auto ms = [](const std::string& iso) {  // "2026-11-26T18:12:27.276Z": the seconds of the day
    const int h = std::stoi(iso.substr(11, 2)), m = std::stoi(iso.substr(14, 2));
    return (h * 3600 + m * 60) * 1000LL + std::llround(std::stod(iso.substr(17, 6)) * 1000);
  };
  std::optional<long long> a, b;
  for (const auto& e : log) {
    if (!a && e["event"] == from) a = ms(e["time"].get<std::string>());
    if (!b && e["event"] == to) b = ms(e["time"].get<std::string>());
  }
  REQUIRE(a);
  REQUIRE(b);
  return *b - *a;
}

// The state letter of /proc/PID/stat ('T': stopped), or 0.
char process_state(int pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? 0 : stat[close + 2];
}

// ctrun --standalone with `ctrun_flags` running tests/python/fault_train.py as job `name`: its
// fault report in NAME.json, `faults` (none: a clean run), its checkpoint in NAME.pt, and
// `script_flags` for the script.
std::vector<std::string> fault_train_job(const ScratchDir& s, const std::string& name,
                                         const std::vector<std::string>& ctrun_flags,
                                         const std::vector<std::string>& faults,
                                         const std::vector<std::string>& script_flags = {}) {
  std::vector<std::string> argv = {CTRUN_PATH, "--standalone"};
  argv.insert(argv.end(), ctrun_flags.begin(), ctrun_flags.end());
  argv.insert(argv.end(), {"--fault_report", s.path(name + ".json")});
  argv.insert(argv.end(), faults.begin(), faults.end());
  argv.insert(argv.end(), {FAULT_TRAIN_SCRIPT_PATH, "--checkpoint", s.path(name + ".pt")});
  argv.insert(argv.end(), script_flags.begin(), script_flags.end());
  return argv;
}

}  // namespace

TEST_CASE("faults: a planned SIGKILL hits its rank on time, and the job restarts and finishes") {
  ScratchDir s("faults_kill");
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=3", "--max_restarts=1", "--event_log",
       s.path("events"), "--faults", "kill:rank=2,after=1", TEST_WORKER_PATH, "sleep", "3"},
      s.path("agent.log"));
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(log.find("injecting fault 1: SIGKILL to rank 2 at 1.000 s") != std::string::npos);
  CHECK(log.find("worker rank 2 (local rank 2, pid ") != std::string::npos);
  CHECK(log.find("was killed by SIGKILL") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  const auto ev = events(s.path("events"));
  const long long fired = ms_between(ev, "workers_started", "fault_injected");
  CHECK(fired >= 1000);
  CHECK(fired <= 1100);
  for (const auto& e : ev) {
    if (e["event"] != "fault_injected") continue;
    CHECK(e["injected"] == true);
    CHECK(e["rank"] == 2);
  }
}

TEST_CASE("faults: a fault planned at a step hits its rank at that step") {
  ScratchDir s("faults_step");
  // Two workers of 40 steps of 50 ms, reporting each; rank 1 is killed at step 10, and the
  // restarted job runs them all again.
  ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                      "--faults", "kill:rank=1,at_step=10", "--fault_report", s.path("report"),
                      TEST_WORKER_PATH, "steps", "40", s.path("step")},
                     s.path("agent.log"));
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(log.find("injecting fault 1: SIGKILL to rank 1 at step 10") != std::string::npos);
  // The first rank 1 died within a step of step 10; its peer was stopped by the restart; the
  // second attempt ran to the end.
  const std::string first = read_file(s.path("step.1.0"));
  INFO(first);
  REQUIRE_FALSE(first.empty());
  CHECK(std::stoi(first) >= 10);
  CHECK(std::stoi(first) <= 11);
  CHECK(std::stoi(read_file(s.path("step.1.1"))) == 40);
  CHECK(std::stoi(read_file(s.path("step.0.1"))) == 40);
  // The report: the exit seen, the workers running again, the first step of the new process
  // (1: nothing was checkpointed), the steps done again; and its line in the log.
  const Json report = Json::parse(read_file(s.path("report")));
  CHECK(report["outcome"] == "succeeded");
  CHECK(report["restarts"] == 1);
  REQUIRE(report["faults"].size() == 1);
  const Json& f = report["faults"][0];
  CHECK(f["rank"] == 1);
  CHECK(f["worker_exit_ms"].get<int>() >= 0);
  CHECK(f["worker_exit_ms"].get<int>() < 1000);
  CHECK(f["running_again_ms"].get<int>() >= f["worker_exit_ms"].get<int>());
  CHECK(f["first_step"] == 1);
  CHECK(f["first_step_ms"].get<int>() > f["running_again_ms"].get<int>());
  CHECK(f["steps_redone"] == f["step_at_fault"]);
  CHECK(f["step_at_fault"].get<int>() >= 10);
  CHECK(log.find("fault 1 (rank 1): worker exit after ") != std::string::npos);
}

TEST_CASE(
    "faults: a planned hang stops its worker for its duration, and a straggler runs in turns") {
  ScratchDir s("faults_hang");
  // Rank 0 hangs from 0.5 s to 2.5 s; node 0's local rank 1 straggles from 0.5 s for 2 s.
  ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=2", "--event_log",
                      s.path("events"), "--faults",
                      "hang:rank=0,after=0.5,duration=2;straggler:node=0,local_rank=1,after=0.5,"
                      "duration=2,speed=0.5",
                      TEST_WORKER_PATH, "grandchild", s.path("pids")},
                     s.path("agent.log"));
  std::vector<int> workers, children;
  for (int rank = 0; rank < 2; ++rank) {
    auto line = wait_for_file(s.path("pids." + std::to_string(rank)), 20s);
    REQUIRE(line);
    std::istringstream pids(*line);
    int worker = 0, child = 0;
    pids >> worker >> child;
    workers.push_back(worker);
    children.push_back(child);
  }
  // While hung, the worker and the child in its process group are stopped; the straggler is
  // stopped some of the time and running some of the time.
  std::this_thread::sleep_for(1s);
  CHECK(process_state(workers[0]) == 'T');
  CHECK(process_state(children[0]) == 'T');
  int straggler_stopped = 0, straggler_running = 0;
  for (int i = 0; i < 40; ++i) {
    (process_state(workers[1]) == 'T' ? straggler_stopped : straggler_running) += 1;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(straggler_stopped > 0);
  CHECK(straggler_running > 0);
  std::this_thread::sleep_for(2s);  // past 2.5 s: both run again
  CHECK(process_state(workers[0]) != 'T');
  CHECK(process_state(workers[1]) != 'T');
  agent.signal(SIGTERM);
  REQUIRE(agent.wait(60s));
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(log.find("injecting fault 1: rank 0 hung (SIGSTOP, resumed after 2.000 s) at 0.500 s") !=
        std::string::npos);
  CHECK(log.find("injecting fault 2: node 0 local rank 1 slowed to 50 % for 2.000 s at 0.500 s") !=
        std::string::npos);
  int injected = 0;
  for (const auto& e : events(s.path("events"))) injected += e["event"] == "fault_injected";
  CHECK(injected == 2);
}

TEST_CASE("faults: a worker hung for good by the plan is stopped with the job on SIGTERM") {
  ScratchDir s("faults_forever");
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=1", "--shutdown_timeout=2", "--faults",
       "hang:rank=0,after=0.2", TEST_WORKER_PATH, "grandchild", s.path("pids")},
      s.path("agent.log"));
  auto line = wait_for_file(s.path("pids.0"), 20s);
  REQUIRE(line);
  std::istringstream pids(*line);
  int worker = 0, child = 0;
  pids >> worker >> child;
  REQUIRE(wait_for_text(s.path("agent.log"), "injecting fault 1", 10s));
  std::this_thread::sleep_for(200ms);
  CHECK(process_state(worker) == 'T');
  const auto stop_began = std::chrono::steady_clock::now();
  agent.signal(SIGTERM);
  REQUIRE(agent.wait(30s));
  // Continued after the signal, the worker sees it at once: no wait for the grace's SIGKILL.
  CHECK(std::chrono::steady_clock::now() - stop_began < 2s);
  CHECK(::kill(worker, 0) != 0);
  CHECK(::kill(child, 0) != 0);
}

TEST_CASE("faults: a lost node's agent and workers die together, and the job re-forms") {
  ScratchDir s("faults_node");
  // Two nodes of an elastic 1:2 job on 127.0.0.1, both with the plan: node 1 is lost at 1 s,
  // node 0 goes on alone (workers that end once they are the only node). The rendezvous is a
  // ctrund of its own: were it an agent's embedded one, the lost node could be its host (group
  // ranks follow the order of the joins), and the survivor would have nothing to re-form on.
  std::unique_ptr<ChildProcess> daemon;
  const std::string endpoint = "127.0.0.1:" + std::to_string(start_ctrund(daemon, s, CTRUND_PATH));
  auto agent = [&](const std::string& name) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CTRUN_PATH, "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
            "--rdzv_endpoint=" + endpoint, "--rdzv_id=lost", "--rdzv_conf=last_call_timeout=1",
            "--faults", "node_lost:node=1,after=1", TEST_WORKER_PATH, "until_alone", s.path(name)},
        s.path(name + ".log"));
  };
  auto a = agent("a");
  auto b = agent("b");
  // Each agent's worker writes its pid to NAME.<its rank>: rank 0 or 1, as the round says.
  auto worker_pid = [&](const std::string& name) -> std::optional<int> {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      for (const char* rank : {".0", ".1"}) {
        const std::string pid = read_file(s.path(name + rank));
        if (!pid.empty() && pid.back() == '\n') return std::stoi(pid);
      }
      std::this_thread::sleep_for(20ms);
    }
    return std::nullopt;
  };
  const auto pid_a = worker_pid("a");
  const auto pid_b = worker_pid("b");
  REQUIRE(pid_a);
  REQUIRE(pid_b);
  // Which agent is node 1 is the rendezvous's choice: the one that dies.
  std::optional<int> rc_a, rc_b;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while ((!rc_a || !rc_b) && std::chrono::steady_clock::now() < deadline) {
    if (!rc_a) rc_a = a->wait(50ms);
    if (!rc_b) rc_b = b->wait(50ms);
  }
  const std::string logs = read_file(s.path("a.log")) + read_file(s.path("b.log"));
  INFO(logs);
  REQUIRE(rc_a);
  REQUIRE(rc_b);
  CHECK(((*rc_a == 128 + SIGKILL && *rc_b == 0) || (*rc_b == 128 + SIGKILL && *rc_a == 0)));
  CHECK(logs.find("injecting fault 1: node 1 lost (its agent and workers killed) at 1.000 s") !=
        std::string::npos);
  // The lost node's worker died with it (gone, or a zombie its new parent has yet to reap);
  // the survivor's round 1 has one node.
  const int lost_worker = *rc_a == 128 + SIGKILL ? *pid_a : *pid_b;
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (process_state(lost_worker) != 0 && process_state(lost_worker) != 'Z' &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK((process_state(lost_worker) == 0 || process_state(lost_worker) == 'Z'));
  CHECK(logs.find("round 1: group rank 0 of 1") != std::string::npos);
}

TEST_CASE(
    "faults: an exception is raised inside a Python worker at its step, and the job recovers") {
  ScratchDir s("faults_exception");
  SystemPython python;
  // Rank 1 of two Python workers (30 steps of 50 ms, reported through ctrun_worker) raises once
  // it has reported step 10; the restarted job runs to the end and both results are reported.
  ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                      "--faults", "exception:rank=1,at_step=10", "--fault_report", s.path("report"),
                      REPORT_STEPS_SCRIPT_PATH, "30", s.path("step")},
                     s.path("agent.log"));
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(log.find("injecting fault 1: an exception raised in rank 1 at step 10") !=
        std::string::npos);
  // The worker's own traceback: raised in the script's report_step call.
  CHECK(log.find("ctrun_worker.InjectedFault: ctrun: injected fault 1: an exception raised in "
                 "rank 1 at step 10") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  // Raised at the first step it reported after step 10 (the agent reads steps every 20 ms,
  // steps are 50 ms), before reporting it.
  const std::string first = read_file(s.path("step.1.0"));
  REQUIRE_FALSE(first.empty());
  CHECK(std::stoi(first) >= 10);
  CHECK(std::stoi(first) <= 11);
  CHECK(std::stoi(read_file(s.path("step.1.1"))) == 30);
  const Json report = Json::parse(read_file(s.path("report")));
  REQUIRE(report["faults"].size() == 1);
  const Json& f = report["faults"][0];
  CHECK(f["worker_exit_ms"].get<int>() >= 0);
  CHECK(f["worker_exit_ms"].get<int>() < 1000);
  CHECK(f["first_step"] == 1);
  CHECK(f["steps_redone"] == f["step_at_fault"]);
  CHECK(report["results"] == Json{{"0", "rank 0"}, {"1", "rank 1"}});
}

TEST_CASE("faults: an exception planned for a C++ worker is thrown by its report_step") {
  ScratchDir s("faults_exception_cc");
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--faults",
       "exception:node=0,local_rank=0,at_step=5", TEST_WORKER_PATH, "steps", "20", s.path("step")},
      s.path("agent.log"));
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(log.find("ctrun: injected fault 1: an exception raised in node 0 local rank 0 at step 5") !=
        std::string::npos);
  const std::string first = read_file(s.path("step.0.0"));
  REQUIRE_FALSE(first.empty());
  CHECK(std::stoi(first) >= 5);
  CHECK(std::stoi(first) <= 7);  // test_worker writes a step before it reports it
  CHECK(std::stoi(read_file(s.path("step.0.1"))) == 20);
}

TEST_CASE("faults: a Python gloo job under a random plan of five faults ends as a clean run") {
  ScratchDir s("faults_python");
  SystemPython python;
  auto job = [&](const std::string& name, const std::vector<std::string>& faults) {
    return fault_train_job(s, name, {"--nproc_per_node=3", "--max_restarts=8"}, faults);
  };
  // The clean run's report holds its results (no plan: no faults).
  ChildProcess clean(job("clean", {}), s.path("clean.log"));
  const auto clean_rc = clean.wait(120s);
  INFO(read_file(s.path("clean.log")));
  REQUIRE(clean_rc == std::optional<int>(0));
  const Json clean_report = Json::parse(read_file(s.path("clean.json")));
  CHECK(clean_report["faults"].empty());
  REQUIRE(clean_report["results"].size() == 3);
  const Json clean_digest = clean_report["results"]["0"];

  // Kills, a SIGTERM, exceptions raised in the script and hangs, at steps drawn from the seed;
  // each failure restarts the job from rank 0's last checkpoint (every 5 steps).
  ChildProcess faulted(
      job("faulted", {"--faults",
                      "random:seed=11,count=5,kinds=kill+term+exception+hang,ranks=0-2,"
                      "steps=5-110,duration=1"}),
      s.path("faulted.log"));
  const auto rc = faulted.wait(240s);
  const std::string log = read_file(s.path("faulted.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(count_of(log, "ctrun: injecting fault ") == 5);
  CHECK(log.find("ctrun_worker.InjectedFault: ctrun: injected fault ") != std::string::npos);
  const Json report = Json::parse(read_file(s.path("faulted.json")));
  CHECK(report["outcome"] == "succeeded");
  CHECK(report["faults"].size() == 5);
  CHECK(report["restarts"].get<int>() >= 3);
  REQUIRE(report["results"].size() == 3);
  for (const auto& [rank, digest] : report["results"].items()) {
    INFO("rank " << rank);
    CHECK(digest == clean_digest);
  }
}

TEST_CASE("faults: ctrun fault injects into a running job, and ctrun status shows it apart") {
  ScratchDir s("faults_live");
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH);
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  // Two workers of 100 steps of 50 ms; no planned fault, but the agent takes asked-for ones.
  ChildProcess agent(
      {CTRUN_PATH, "--nnodes=1", "--nproc_per_node=2", "--rdzv_backend=c10d",
       "--rdzv_endpoint=" + endpoint, "--rdzv_id=live", "--max_restarts=1", "--faults=live",
       "--event_log", s.path("events"), TEST_WORKER_PATH, "steps", "100", s.path("step")},
      s.path("agent.log"));
  REQUIRE(wait_for_text(s.path("agent.log"), "round 0: group rank 0", 20s));
  std::this_thread::sleep_for(500ms);
  ChildProcess fault(
      {CTRUN_PATH, "fault", "--rdzv_endpoint", endpoint, "--rdzv_id", "live", "kill:rank=1"},
      s.path("fault.log"));
  const auto fault_rc = fault.wait(30s);
  const std::string fault_out = read_file(s.path("fault.log"));
  INFO(fault_out);
  CHECK(fault_rc == std::optional<int>(0));
  CHECK(fault_out.find("ctrun fault: asked job 'live' for fault 1: ") != std::string::npos);
  CHECK(fault_out.find("ctrun fault: injected on node ") != std::string::npos);
  CHECK(fault_out.find("fault 1: SIGKILL to rank 1 at ") != std::string::npos);

  // The job restarts and finishes; the status says a fault was injected on purpose.
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(rc == std::optional<int>(0));
  CHECK(
      log.find("fault asked for (ctrun fault 1): fault 1: SIGKILL to rank 1 at 0.000 s from now") !=
      std::string::npos);
  CHECK(log.find("injecting fault 1: SIGKILL to rank 1") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  ChildProcess status(
      {CTRUN_PATH, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "live", "--json"},
      s.path("status.json"));
  REQUIRE(status.wait(30s) == std::optional<int>(0));
  const Json st = Json::parse(read_file(s.path("status.json")));
  CHECK(st["faults_injected"] == 1);
  CHECK(st["last_fault"]["injected"] == true);
  CHECK(st["last_fault"]["rank"] == 1);
  CHECK(st["last_fault"]["request"] == 1);
  CHECK(st["restarts"] == 1);
  int requested = 0;
  for (const auto& e : events(s.path("events"))) requested += e["event"] == "fault_requested";
  CHECK(requested == 1);

  // A job nobody injects into: the command says so, and fails.
  ChildProcess lonely({CTRUN_PATH, "fault", "--rdzv_endpoint", endpoint, "--rdzv_id", "nobody",
                       "--wait", "0.5", "term:rank=0"},
                      s.path("lonely.log"));
  CHECK(lonely.wait(30s) == std::optional<int>(1));
  CHECK(read_file(s.path("lonely.log")).find("no agent of job 'nobody' took it") !=
        std::string::npos);
  ChildProcess bad({CTRUN_PATH, "fault", "--rdzv_endpoint", endpoint, "--rdzv_id", "live",
                    "kill:rank=1;kill:rank=0"},
                   s.path("bad.log"));
  CHECK(bad.wait(30s) == std::optional<int>(2));
  CHECK(read_file(s.path("bad.log")) ==
        "ctrun fault: error: one fault at a time, got 'kill:rank=1;kill:rank=0'\n");
}

TEST_CASE("faults: the same seed twice gives the same faults and the same recoveries") {
  ScratchDir s("faults_replay");
  // Seed 78 draws a hang of rank 0 at step 3, then rank 1 killed at step 13, an exception at
  // its step 15 and a SIGTERM at its step 16, each after the restart the one before caused.
  auto run = [&](const std::string& name) {
    ChildProcess agent(
        {CTRUN_PATH, "--standalone", "--nproc_per_node=2", "--max_restarts=6", "--faults",
         "random:seed=78,count=4,kinds=kill+term+exception+hang,ranks=0-1,"
         "steps=3-25,duration=0.3",
         "--fault_report", s.path(name + ".json"), TEST_WORKER_PATH, "steps", "30",
         s.path(name + ".step")},
        s.path(name + ".log"));
    const auto rc = agent.wait(60s);
    const std::string log = read_file(s.path(name + ".log"));
    INFO(log);
    REQUIRE(rc == std::optional<int>(0));
    // What fired, in order, and how each fault ended: the worker's exit, running again.
    std::string sequence;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      const auto at = line.find("injecting fault ");
      if (at != std::string::npos) sequence += line.substr(at) + "\n";
    }
    const Json report = Json::parse(read_file(s.path(name + ".json")));
    for (const Json& f : report["faults"]) {
      sequence += "fault " + f["fault"].dump() + ": exit " +
                  (f.contains("worker_exit") ? "seen" : "none") + ", running again " +
                  (f.contains("running_again") ? "yes" : "no") + "\n";
    }
    sequence += "restarts " + report["restarts"].dump() + "\n";
    return sequence;
  };
  const std::string first = run("first");
  CHECK(first.find("injecting fault 1: rank 0 hung (SIGSTOP, resumed after 0.300 s) at step 3\n"
                   "injecting fault 4: SIGKILL to rank 1 at step 13\n"
                   "injecting fault 3: an exception raised in rank 1 at step 15\n"
                   "injecting fault 2: SIGTERM to rank 1 at step 16\n") == 0);
  CHECK(first.find("restarts 3") != std::string::npos);
  CHECK(run("second") == first);
}

TEST_CASE("faults: store latency makes the rendezvous answer the job late, for its duration") {
  ScratchDir s("faults_latency");
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH);
  // From 0.5 s, ctrund answers job 'lat' 300 ms late for 3 s.
  ChildProcess agent({CTRUN_PATH, "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
                      "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=lat",
                      "--faults", "store_latency:ms=300,duration=3,after=0.5", "--fault_report",
                      s.path("report.html"), TEST_WORKER_PATH, "sleep", "6"},
                     s.path("agent.log"));
  REQUIRE(wait_for_text(s.path("agent.log"),
                        "injecting fault 1: the rendezvous answering 300 ms late for 3.000 s",
                        20s));
  ctrun::rendezvous::ClientOptions options;
  options.port = port;
  options.job = "lat";
  auto client = ctrun::rendezvous::Client::connect(options);
  REQUIRE(client);
  auto timed_ping = [&] {
    const auto began = std::chrono::steady_clock::now();
    REQUIRE(client.value()->ping());
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 began);
  };
  const auto late = timed_ping();
  CHECK(late >= 290ms);  // the daemon's tick (50 ms) sends it at most that much later
  CHECK(late < 1000ms);
  std::this_thread::sleep_for(3500ms);  // past the fault's 3 s
  CHECK(timed_ping() < 200ms);
  REQUIRE(agent.wait(60s) == std::optional<int>(0));
  CHECK(read_file(s.path("ctrund.log")).find("job 'lat': answering 300 ms late for") !=
        std::string::npos);
  // Its marker is on the page's lane of node and rendezvous faults.
  const std::string page = read_file(s.path("report.html"));
  CHECK(page.find(">node, rendezvous</text>") != std::string::npos);
  CHECK(count_of(page, "class=\"fault-marker\"") == 1);
}

TEST_CASE("faults: a node cut off from the rendezvous is dropped, refused, then joins again") {
  ScratchDir s("faults_cut_off");
  std::unique_ptr<ChildProcess> daemon;
  const std::string endpoint = "127.0.0.1:" + std::to_string(start_ctrund(daemon, s, CTRUND_PATH));
  // An elastic 1:2 job; node 1's agent is cut off at 1 s for 3 s. Its dropped connection makes
  // ctrund drop the node; node 0 goes on alone; node 1, refused until the 3 s are up, then finds
  // itself dropped and joins again, and the job runs with both to its end.
  auto agent = [&](const std::string& name) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{CTRUN_PATH, "--nnodes=1:2", "--nproc_per_node=1",
                                 "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                                 "--rdzv_id=cut", "--rdzv_conf=last_call_timeout=1", "--faults",
                                 "cut_off:node=1,after=1,duration=3", "--fault_report",
                                 s.path(name + ".json"), TEST_WORKER_PATH, "sleep", "6"},
        s.path(name + ".log"));
  };
  auto a = agent("a");
  auto b = agent("b");
  const auto rc_a = a->wait(60s);
  const auto rc_b = b->wait(60s);
  const std::string logs = read_file(s.path("a.log")) + read_file(s.path("b.log"));
  INFO(logs << "\nctrund:\n" << read_file(s.path("ctrund.log")));
  REQUIRE(rc_a == std::optional<int>(0));
  REQUIRE(rc_b == std::optional<int>(0));
  CHECK(count_of(logs,
                 "injecting fault 1: node 1 cut off from the rendezvous for 3.000 s at "
                 "1.000 s") == 1);
  CHECK(logs.find("connection refused: cut off from the rendezvous by fault 1") !=
        std::string::npos);
  CHECK(logs.find("round 1: group rank 0 of 1") != std::string::npos);  // node 0 alone
  // Recorded in the job's store (ctrun status) before its connection was cut.
  CHECK(logs.find("not recorded in the job's store") == std::string::npos);
  // The cut-off node's report: its worker ran again only after the 3 s (it rejoined then).
  const std::string cut = read_file(s.path("a.log")).find("injecting fault 1") != std::string::npos
                              ? "a.json"
                              : "b.json";
  const Json report = Json::parse(read_file(s.path(cut)));
  REQUIRE(report["faults"].size() == 1);
  const Json& f = report["faults"][0];
  CHECK(f["rank"] == -1);
  REQUIRE(f.contains("running_again_ms"));
  CHECK(f["running_again_ms"].get<int>() >= 3000);
  CHECK(f["running_again_ms"].get<int>() < 15000);
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s) == 0);
}

TEST_CASE("faults: a node cut off from etcd loses its lease, then joins again") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("faults_cut_off_etcd");
  EtcdCluster etcd(s, 1);
  // As on ctrund, but the node goes when its lease runs out (2 s), not when its connection
  // closes; the cut-off node then watches the job again and sees the round it joins form.
  auto agent = [&](const std::string& name) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CTRUN_PATH, "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=etcd",
            "--rdzv_endpoint=" + etcd.endpoints(), "--rdzv_id=cut",
            "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=1",
            "--faults", "cut_off:node=1,after=1,duration=4", TEST_WORKER_PATH, "sleep", "6"},
        s.path(name + ".log"));
  };
  auto a = agent("a");
  auto b = agent("b");
  const auto rc_a = a->wait(60s);
  const auto rc_b = b->wait(60s);
  const std::string logs = read_file(s.path("a.log")) + read_file(s.path("b.log"));
  INFO(logs);
  REQUIRE(rc_a == std::optional<int>(0));
  REQUIRE(rc_b == std::optional<int>(0));
  CHECK(logs.find("its etcd lease expired") != std::string::npos);
  CHECK(logs.find("connection refused: cut off from the rendezvous by fault 1") !=
        std::string::npos);
  // Both nodes in a round of 2 at the start, and again after the cut-off.
  CHECK(count_of(logs, " of 2, ranks ") >= 4);
}

TEST_CASE("faults: the hosted rendezvous killed and restarted, the job goes on without a restart") {
  ScratchDir s("faults_rdzv_restart");
  // Two agents of a c10d job on this host: one hosts the rendezvous. At 1 s it is killed (every
  // connection closed) and comes back 2 s later from its state files: both agents reconnect,
  // resume their places, and the workers run on untouched.
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto agent = [&](const std::string& name) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CTRUN_PATH, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
            "--rdzv_endpoint=" + endpoint, "--rdzv_id=rr", "--faults",
            "rendezvous_restart:after=1,duration=2", TEST_WORKER_PATH, "sleep", "6"},
        s.path(name + ".log"));
  };
  auto a = agent("a");
  auto b = agent("b");
  const auto rc_a = a->wait(60s);
  const auto rc_b = b->wait(60s);
  const std::string log_a = read_file(s.path("a.log"));
  const std::string log_b = read_file(s.path("b.log"));
  const std::string logs = log_a + log_b;
  INFO(logs);
  REQUIRE(rc_a == std::optional<int>(0));
  REQUIRE(rc_b == std::optional<int>(0));
  const std::string& host =
      log_a.find("hosting the rendezvous on") != std::string::npos ? log_a : log_b;
  CHECK(count_of(host, "injecting fault 1: the rendezvous killed, restarted after 2.000 s") == 1);
  CHECK(host.find("fault 1: the rendezvous this agent hosts is down") != std::string::npos);
  CHECK(count_of(host, "hosting the rendezvous on") == 2);
  CHECK(count_of(logs, "lost the rendezvous") == 2);
  // No restart, no new round: each worker started once.
  CHECK(logs.find("restarting") == std::string::npos);
  CHECK(count_of(logs, "round 0: group rank") == 2);
  CHECK(logs.find("round 1:") == std::string::npos);
}

TEST_CASE("faults: a full disk for the checkpoint directory, for its duration") {
  if (::geteuid() != 0) CTRUN_SKIP("needs root to mount a small tmpfs (in a mount namespace)");
  ScratchDir s("faults_disk");
  const std::string dir = s.path("ckpt");
  std::filesystem::create_directories(dir);
  // The agent runs in a mount namespace of its own with a 16 MiB tmpfs as the checkpoint
  // directory. Its worker writes a 64 KiB "checkpoint" every 100 ms for 5 s, a new file each
  // time (the one before removed once it is written), and notes each write's outcome; the disk
  // is full from 1 s for 2 s.
  const std::string worker = "cd " + dir +
                             " && for i in $(seq 50); do if head -c 65536 /dev/zero > ckpt.$i "
                             "2>/dev/null; then echo ok; rm -f ckpt.$((i-1)); else echo full; "
                             "rm -f ckpt.$i; fi >> " +
                             s.path("writes") + "; sleep 0.1; done";
  ChildProcess agent({"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
                      "mount -t tmpfs -o size=16m ctrun-test \"$0\" && exec \"$@\"", dir,
                      CTRUN_PATH, "--standalone", "--nproc_per_node=1", "--faults",
                      "disk_full:node=0,path=" + dir + ",after=1,duration=2", "--no_python",
                      "/bin/sh", "-c", worker},
                     s.path("agent.log"));
  const auto rc = agent.wait(60s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc == std::optional<int>(0));
  CHECK(log.find("injecting fault 1: the disk of '" + dir + "' on node 0 full for 2.000 s") !=
        std::string::npos);
  CHECK(log.find("fault 1: the disk of '" + dir + "' is full (") != std::string::npos);
  CHECK(log.find("fault 1: the disk has room again") != std::string::npos);
  // Writes went, then failed while it was full (about 2 s of 100 ms writes), then went again.
  const std::string writes = read_file(s.path("writes"));
  const auto first_full = writes.find("full");
  REQUIRE(first_full != std::string::npos);
  CHECK(writes.find("ok") < first_full);
  CHECK(writes.rfind("ok") > writes.rfind("full"));
  CHECK(count_of(writes, "full") >= 10);
  CHECK(count_of(writes, "full") <= 25);
}

TEST_CASE("faults: a bad plan is a one-line error before anything starts") {
  ScratchDir s("faults_bad");
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--faults", "kill:rank=1", TEST_WORKER_PATH, "sleep", "30"},
      s.path("agent.log"));
  const auto rc = agent.wait(20s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc != 0);
  CHECK(log.find("--faults: fault 1: says not when: give after=SECONDS, window=FROM-TO or "
                 "at_step=N") != std::string::npos);
  CHECK(log.find("round 0") == std::string::npos);
}

namespace {

// Whether this machine shows ctrun an NVIDIA GPU (what the agent checks for a CUDA error), and
// whether python3 on PATH has a CUDA torch (what a Python worker makes one with).
bool gpu_visible() {
  return ctrun::launcher::probe_machine(ctrun::launcher::process_env()).gpu_count > 0;
}
bool python_has_cuda(const ScratchDir& s) {
  ChildProcess probe({"/usr/bin/env", "python3", "-c",
                      "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"},
                     s.path("probe.log"));
  return probe.wait(60s) == std::optional<int>(0);
}

}  // namespace

TEST_CASE("faults: a CUDA error needs a GPU: refused on a node without one, said by the helper") {
  if (gpu_visible()) CTRUN_SKIP("a GPU is visible here: the GPU case makes the CUDA error");
  ScratchDir s("faults_cuda_refused");
  ChildProcess agent({CTRUN_PATH, "--standalone", "--faults", "cuda_error:rank=0,at_step=3",
                      TEST_WORKER_PATH, "steps", "20", s.path("step")},
                     s.path("agent.log"));
  const auto rc = agent.wait(20s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc != 0);
  CHECK(log.find("--faults: fault 1: a CUDA error is made by a failing kernel on the worker's "
                 "GPU, and this node has none visible (no /dev/nvidiaN, or CUDA_VISIBLE_DEVICES "
                 "hides them)") != std::string::npos);
  CHECK(log.find("round 0") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(s.path("step.0.0")));

  // A Python worker given a CUDA error where torch sees no GPU (torch 1.13 for CPU here) raises
  // ctrun_worker.InjectedFault saying so, as the agent's file asks it to.
  std::ofstream(s.path("fault")) << "cuda_error\nctrun: injected fault 1: a CUDA error in rank 0 "
                                    "at step 3\n";
  ChildProcess worker(
      {"/usr/bin/env", "CTRUN_FAULT_FILE=" + s.path("fault"), "PYTHONPATH=" CTRUN_PYTHON_HELPER_DIR,
       "/usr/bin/python3", "-c", "import ctrun_worker; ctrun_worker.report_step(3)"},
      s.path("worker.log"));
  CHECK(worker.wait(60s) == std::optional<int>(1));
  const std::string said = read_file(s.path("worker.log"));
  INFO(said);
  CHECK(said.find("ctrun_worker.InjectedFault: ctrun: injected fault 1: a CUDA error in rank 0 at "
                  "step 3: no CUDA device in this worker (torch.cuda.is_available() is False); "
                  "raised as an exception instead") != std::string::npos);
}

// On a GPU machine: a Python job over NCCL on cuda:0, its worker's CUDA context broken by the
// planned kernel at its first step reported once the agent saw step 20; the job restarts from its
// checkpoint and ends with the parameters of a clean run.
TEST_CASE("faults: a CUDA error in a Python NCCL worker at its step, and the job recovers (GPU)") {
  ScratchDir s("faults_cuda_python");
  if (!gpu_visible() || !python_has_cuda(s)) {
    CTRUN_SKIP("needs a CUDA device and python3 with a CUDA torch");
  }
  auto job = [&](const std::string& name, const std::vector<std::string>& faults) {
    return fault_train_job(s, name, {"--nproc_per_node=1", "--max_restarts=1"}, faults,
                           {"--device", "cuda", "--steps", "60"});
  };
  ChildProcess clean(job("clean", {}), s.path("clean.log"));
  const auto clean_rc = clean.wait(180s);
  INFO(read_file(s.path("clean.log")));
  REQUIRE(clean_rc == std::optional<int>(0));
  const Json clean_report = Json::parse(read_file(s.path("clean.json")));
  REQUIRE(clean_report["results"].size() == 1);

  ChildProcess faulted(job("faulted", {"--faults", "cuda_error:rank=0,at_step=20"}),
                       s.path("faulted.log"));
  const auto rc = faulted.wait(180s);
  const std::string log = read_file(s.path("faulted.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(log.find("injecting fault 1: a CUDA error in rank 0 at step 20") != std::string::npos);
  CHECK(log.find("launching a kernel that fails on cuda:0") != std::string::npos);
  CHECK(log.find("device-side assert triggered") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  const Json report = Json::parse(read_file(s.path("faulted.json")));
  CHECK(report["outcome"] == "succeeded");
  REQUIRE(report["faults"].size() == 1);
  CHECK(report["faults"][0]["what"] == "fault 1: a CUDA error in rank 0 at step 20");
  CHECK(report["results"] == clean_report["results"]);
}

// docs/faults.md's pytest recipe (docs/examples/test_faults.py) run as a user runs it, on
// fault_train.py: it passes where the job survives its plan, and fails where the job dies of it.
TEST_CASE(
    "faults: the pytest recipe of docs/faults.md passes on a Python job, fails one that dies") {
  ScratchDir s("faults_recipe_pytest");
  SystemPython python;
  ChildProcess probe({"/usr/bin/python3", "-c", "import pytest"}, s.path("probe.log"));
  if (probe.wait(60s) != std::optional<int>(0)) {
    CTRUN_SKIP("needs pytest for /usr/bin/python3 (Debian: python3-pytest)");
  }
  auto recipe = [&](const std::string& name, const std::string& plan,
                    const std::string& max_restarts) {
    // No cache or bytecode written next to the recipe: the source tree stays as it is.
    return std::vector<std::string>{"/usr/bin/env",
                                    "CTRUN=" CTRUN_PATH,
                                    "TRAIN_SCRIPT=" FAULT_TRAIN_SCRIPT_PATH,
                                    "SCRIPT_ARGS=--steps 60",
                                    "NPROC=2",
                                    "FAULT_PLAN=" + plan,
                                    "MAX_RESTARTS=" + max_restarts,
                                    "PYTHONDONTWRITEBYTECODE=1",
                                    "/usr/bin/python3",
                                    "-m",
                                    "pytest",
                                    "-q",
                                    "-p",
                                    "no:cacheprovider",
                                    "--basetemp",
                                    s.path(name),
                                    FAULTS_PYTEST_PATH};
  };
  ChildProcess passing(
      recipe("pass",
             "random:seed=7,count=3,kinds=kill+exception+hang,ranks=0-1,steps=5-50,duration=1",
             "10"),
      s.path("pass.log"));
  const auto passed = passing.wait(300s);
  std::string out = read_file(s.path("pass.log"));
  INFO(out);
  CHECK(passed == std::optional<int>(0));
  CHECK(out.find("1 passed") != std::string::npos);

  ChildProcess failing(recipe("fail", "kill:rank=1,at_step=10", "0"), s.path("fail.log"));
  const auto failed = failing.wait(300s);
  out = read_file(s.path("fail.log"));
  INFO(out);
  REQUIRE(failed);
  CHECK(*failed != 0);
  CHECK(out.find("1 failed") != std::string::npos);
  CHECK(out.find("faulted run failed (1)") != std::string::npos);
}
