// Multi-process tests of the ctrun agent on loopback: real agents, real workers (test_worker and
// a real PyTorch DDP script), every process stopped and reaped by PID when a test ends.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "catch.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A scratch directory for one test, removed at the end.
struct Scratch : ScratchDir {
  Scratch() : ScratchDir("agent") {}
};

std::vector<std::string> ctrun_args(std::vector<std::string> args) {
  args.insert(args.begin(), CTRUN_PATH);
  return args;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// One agent of a 1:2 job with one worker, against the ctrund on `port` (is_host=false: the
// rendezvous stays up whichever agent dies).
std::unique_ptr<ChildProcess> start_elastic_node(const Scratch& s, std::uint16_t port,
                                                 const std::string& run_id,
                                                 const std::string& rdzv_conf,
                                                 const std::vector<std::string>& worker_args,
                                                 const std::string& log) {
  std::vector<std::string> args = {
      "--nnodes=1:2",         "--nproc_per_node=1",
      "--rdzv_backend=c10d",  "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
      "--rdzv_id=" + run_id,  "--rdzv_conf=is_host=false," + rdzv_conf,
      "--shutdown_timeout=2", TEST_WORKER_PATH};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(ctrun_args(args), s.path(log));
}

// Waits (bounded) until `path` exists.
bool wait_exists(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

}  // namespace

TEST_CASE("agent: standalone with 1 and with 4 workers") {
  for (int n : {1, 4}) {
    Scratch s;
    ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=" + std::to_string(n),
                                   TEST_WORKER_PATH, "env", s.path("env")}),
                       s.path("agent.log"));
    auto code = agent.wait(30s);
    INFO(read_file(s.path("agent.log")));
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    std::set<std::string> ports;
    for (int rank = 0; rank < n; ++rank) {
      auto env = read_env_file(s.path("env." + std::to_string(rank)));
      CHECK(env["RANK"] == std::to_string(rank));
      CHECK(env["LOCAL_RANK"] == std::to_string(rank));
      CHECK(env["WORLD_SIZE"] == std::to_string(n));
      CHECK(env["LOCAL_WORLD_SIZE"] == std::to_string(n));
      CHECK(env["GROUP_RANK"] == "0");
      CHECK(env["ROLE_NAME"] == "default");
      CHECK(env["MASTER_ADDR"] == standalone_master_addr());  // as torch 2.x: this node
      CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
      CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");  // the agent's daemon serves it
      CHECK(env["OMP_NUM_THREADS"] == (n > 1 ? "1" : "<unset>"));
      CHECK(env["X_SIGPIPE_IGNORED"] == "0");  // the agent ignores SIGPIPE; workers must not
      CHECK(env["TORCHELASTIC_ERROR_FILE"].find("/attempt_0/" + std::to_string(rank) +
                                                "/error.json") != std::string::npos);
      ports.insert(env["MASTER_PORT"]);
    }
    CHECK(ports.size() == 1);  // one master for everybody
    // ... which is the agent's own daemon, serving the job's store as torch's TCPStore.
    const std::string log = read_file(s.path("agent.log"));
    CHECK(log.find("hosting the rendezvous on ") != std::string::npos);
    CHECK(log.find(":" + *ports.begin() + "\n") != std::string::npos);
  }
}

TEST_CASE("agent: standalone's store on --local_addr, or on 127.0.0.1 where it cannot listen") {
  Scratch s;
  // 127.0.0.2 is this machine's (all of 127.0.0.0/8 is); 198.18.0.99 is nobody's here.
  for (const auto& [local_addr, master] : std::vector<std::pair<std::string, std::string>>{
           {"127.0.0.2", "127.0.0.2"}, {"198.18.0.99", "127.0.0.1"}}) {
    const std::string log = s.path("agent-" + local_addr + ".log");
    ChildProcess agent(
        ctrun_args({"--standalone", "--nproc_per_node=2", "--local_addr=" + local_addr,
                    TEST_WORKER_PATH, "env", s.path("env-" + local_addr)}),
        log);
    REQUIRE(agent.wait(30s) == std::optional<int>(0));
    INFO(read_file(log));
    for (int rank = 0; rank < 2; ++rank) {
      auto env = read_env_file(s.path("env-" + local_addr + "." + std::to_string(rank)));
      CHECK(env["MASTER_ADDR"] == master);
      CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
    }
    const bool fell_back =
        read_file(log).find("--standalone: cannot listen on 198.18.0.99 (") != std::string::npos;
    CHECK(fell_back == (master == "127.0.0.1"));
  }
}

TEST_CASE("agent: two agents on 127.0.0.1 are two nodes with four unique ranks") {
  Scratch s;
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  auto args = [&](const std::string& log) {
    return ChildProcess(ctrun_args({"--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                                    "--rdzv_endpoint=" + endpoint, "--rdzv_id=two-nodes",
                                    TEST_WORKER_PATH, "env", s.path("env")}),
                        s.path(log));
  };
  ChildProcess a = args("a.log");
  ChildProcess b = args("b.log");
  auto code_a = a.wait(30s);
  auto code_b = b.wait(30s);
  INFO(read_file(s.path("a.log")) + read_file(s.path("b.log")));
  REQUIRE(code_a.has_value());
  REQUIRE(code_b.has_value());
  CHECK(*code_a == 0);
  CHECK(*code_b == 0);
  std::set<std::string> groups;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = read_env_file(s.path("env." + std::to_string(rank)));
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["WORLD_SIZE"] == "4");
    CHECK(env["GROUP_WORLD_SIZE"] == "2");
    CHECK(env["LOCAL_RANK"] == std::to_string(rank % 2));
    CHECK(env["GROUP_RANK"] == std::to_string(rank / 2));
    CHECK(env["TORCHELASTIC_RUN_ID"] == "two-nodes");
    groups.insert(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]);
  }
  CHECK(groups.size() == 1);
}

TEST_CASE(
    "agent: a worker that fails once is restarted and the job succeeds, as --event_log tells") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=2", "--max_restarts=2",
                                 "--event_log=" + s.path("events.jsonl"), TEST_WORKER_PATH,
                                 "fail_once", s.path("env")}),
                     s.path("agent.log"));
  auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(read_env_file(s.path("env.0"))["TORCHELASTIC_RESTART_COUNT"] == "1");
  CHECK(read_env_file(s.path("env.1"))["TORCHELASTIC_RESTART_COUNT"] == "1");
  CHECK(log.find("exited with code 3") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 2 restarts)") != std::string::npos);

  // The agent's story, in order, and its hosted rendezvous's beside it in the same file.
  std::vector<std::string> agent_events;
  std::vector<std::string> rendezvous_events;
  std::istringstream lines(read_file(s.path("events.jsonl")));
  for (std::string line; std::getline(lines, line);) {
    const auto e = nlohmann::json::parse(line);
    REQUIRE(e.contains("time"));
    CHECK(e.at("pid").get<int>() > 0);
    CHECK_FALSE(e.at("job").get<std::string>().empty());
    if (e.at("source") == "ctrun") {
      agent_events.push_back(e.at("event"));
      if (e.at("event") == "worker_exit" && !e.at("ok").get<bool>()) {
        CHECK(e.at("rank") == 1);
        CHECK(e.at("exit_code") == 3);
      }
      if (e.at("event") == "restart") CHECK(e.at("used") == 1);
    } else {
      CHECK(e.at("source") == "ctrun rendezvous");
      rendezvous_events.push_back(e.at("event"));
    }
  }
  // Rank 0 of the first attempt may end before or after rank 1 fails: leave exits out of the
  // order, then count them per attempt.
  std::vector<std::string> steps;
  std::vector<int> exits_per_attempt;
  for (const auto& name : agent_events) {
    if (name == "workers_started") exits_per_attempt.push_back(0);
    if (name == "worker_exit") {
      REQUIRE_FALSE(exits_per_attempt.empty());
      ++exits_per_attempt.back();
    } else {
      steps.push_back(name);
    }
  }
  const std::vector<std::string> expected = {"agent_start", "join",      "round", "workers_started",
                                             "restart",     "join",      "round", "workers_started",
                                             "job_end",     "agent_exit"};
  CHECK(steps == expected);
  REQUIRE(exits_per_attempt.size() == 2);
  CHECK(exits_per_attempt[0] >= 1);  // the failure (and perhaps rank 0's success)
  CHECK(exits_per_attempt[1] == 2);
  CHECK(std::count(rendezvous_events.begin(), rendezvous_events.end(), "round") == 2);
  CHECK(rendezvous_events.back() == "job_end");
}

TEST_CASE("agent: --worker_timeout kills a worker whose heartbeat stops and restarts the job") {
  Scratch s;
  const auto started = std::chrono::steady_clock::now();
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=2", "--max_restarts=1",
                                 "--worker_timeout=1", "--shutdown_timeout=2", "--log_dir",
                                 s.path("logs"), TEST_WORKER_PATH, "hang_once", s.path("env")}),
                     s.path("agent.log"));
  auto code = agent.wait(30s);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // Local rank 1 went quiet 0.5 s in; only it is named, between 1 s and 1.5 s of silence.
  const std::string named = "(local rank 1): no heartbeat for ";
  const auto at = log.find(named);
  REQUIRE(at != std::string::npos);
  const double silent = std::stod(log.substr(at + named.size()));
  CHECK(silent >= 1.0);
  CHECK(silent < 1.6);
  CHECK(log.find("(local rank 0): no heartbeat") == std::string::npos);
  CHECK(log.find("was killed by SIGKILL") != std::string::npos);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  CHECK(read_env_file(s.path("env.0"))["TORCHELASTIC_RESTART_COUNT"] == "1");
  CHECK(read_env_file(s.path("env.1"))["TORCHELASTIC_RESTART_COUNT"] == "1");
  // The agent wrote the reason where the failure report looks for it.
  bool error_file = false;
  for (const auto& e : fs::recursive_directory_iterator(s.path("logs"))) {
    if (e.path().filename() == "error.json" &&
        read_file(e.path().string()).find("killed as hung") != std::string::npos) {
      error_file = e.path().parent_path().filename() == "1";
    }
  }
  CHECK(error_file);
  CHECK(took < 15);
}

TEST_CASE("agent: --worker_timeout leaves alone a worker that never beats") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=1", "--worker_timeout=0.3",
                                 TEST_WORKER_PATH, "sleep", "1.5"}),
                     s.path("agent.log"));
  auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(log.find("no heartbeat") == std::string::npos);
}

TEST_CASE("agent: a failed worker's children do not outlive the restart") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=1", "--max_restarts=1",
                                 TEST_WORKER_PATH, "orphan_then_fail", s.path("orphan")}),
                     s.path("agent.log"));
  auto code = agent.wait(30s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code == std::optional<int>(0));
  const pid_t orphan = std::stoi(read_file(s.path("orphan")));
  REQUIRE(orphan > 0);
  // Gone, or a zombie waiting for init to reap it.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto running = [&] {
    std::ifstream stat("/proc/" + std::to_string(orphan) + "/stat");
    std::string content;
    std::getline(stat, content);
    return !content.empty() && content.find(") Z") == std::string::npos;
  };
  while (running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  CHECK_FALSE(running());
}

TEST_CASE("agent: a worker that always fails spends the budget and is named as root cause") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=2", "--max_restarts=1",
                                 "--log_dir", s.path("logs"), TEST_WORKER_PATH, "exit", "7"}),
                     s.path("agent.log"));
  auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(log.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  CHECK(log.find(std::string(TEST_WORKER_PATH) + " FAILED") != std::string::npos);
  CHECK(log.find("Root Cause (first observed failure):") != std::string::npos);
  CHECK(log.find("exitcode  : 7") != std::string::npos);
}

TEST_CASE("agent: SIGTERM stops every worker and grandchild, and the agent exits 1") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=2", "--shutdown_timeout=5",
                                 TEST_WORKER_PATH, "grandchild", s.path("pids")}),
                     s.path("agent.log"));
  REQUIRE(wait_exists(s.path("pids.0"), 20s));
  REQUIRE(wait_exists(s.path("pids.1"), 20s));
  std::this_thread::sleep_for(100ms);
  std::vector<pid_t> pids;
  for (const char* f : {"pids.0", "pids.1"}) {
    std::istringstream in(read_file(s.path(f)));
    pid_t worker = 0, grandchild = 0;
    in >> worker >> grandchild;
    REQUIRE(worker > 0);
    REQUIRE(grandchild > 0);
    pids.push_back(worker);
    pids.push_back(grandchild);
  }
  for (pid_t p : pids) CHECK(alive(p));
  agent.signal(SIGTERM);
  auto code = agent.wait(20s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  // Reaped or gone: no worker, no grandchild survives. (A zombie grandchild would still answer
  // kill(0); give init a moment to reap the reparented ones.)
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto any_alive = [&] {
    for (pid_t p : pids) {
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string content;
      std::getline(stat, content);
      if (!content.empty() && content.find(") Z") == std::string::npos) return true;
    }
    return false;
  };
  while (any_alive() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  CHECK_FALSE(any_alive());
  CHECK(read_file(s.path("agent.log")).find("received SIGTERM") != std::string::npos);
}

// The parent pid and state of `pid` from /proc (0 and '?' when it is gone).
std::pair<pid_t, char> parent_and_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  std::getline(stat, content);
  const auto close = content.rfind(')');
  if (close == std::string::npos) return {0, '?'};
  std::istringstream rest(content.substr(close + 1));
  char state = '?';
  pid_t parent = 0;
  rest >> state >> parent;
  return {parent, state};
}

TEST_CASE("agent: a worker's descendant in a session of its own is adopted and ends with the job") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=1", TEST_WORKER_PATH,
                                 "daemonize", s.path("daemon")}),
                     s.path("agent.log"));
  auto written = wait_for_file(s.path("daemon.0"), 20s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(written.has_value());
  const pid_t daemon = std::stoi(*written);
  // Its parent gone, it belongs to the agent (a child subreaper), not to init.
  const auto adopted_by = std::chrono::steady_clock::now() + 5s;
  while (parent_and_state(daemon).first != agent.pid() &&
         std::chrono::steady_clock::now() < adopted_by) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(parent_and_state(daemon).first == agent.pid());
  auto code = agent.wait(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // Killed with the job: gone, or a zombie left for init.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto running = [&] {
    const char state = parent_and_state(daemon).second;
    return state != '?' && state != 'Z';
  };
  while (running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK_FALSE(running());
}

namespace {

// Runs a job whose worker leaves an orphan that exits at once; the worker counts, 2.5 s later,
// the zombies its agent holds.
void orphans_are_reaped(std::vector<std::string> argv) {
  Scratch s;
  argv.insert(argv.end(), {CTRUN_PATH, "--standalone", "--nproc_per_node=1", TEST_WORKER_PATH,
                           "orphans", s.path("zombies")});
  ChildProcess agent(argv, s.path("agent.log"));
  auto code = agent.wait(30s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(read_file(s.path("zombies.0")) == "0\n");
}

}  // namespace

TEST_CASE("agent: orphans the workers leave are reaped") { orphans_are_reaped({}); }

TEST_CASE("agent: as PID 1 of a PID namespace the agent reaps the orphans of its workers") {
  if (geteuid() != 0) {
    CTRUN_SKIP("a PID namespace needs root (unshare --pid)");
  }
  orphans_are_reaped({"/usr/bin/unshare", "--pid", "--fork", "--mount-proc"});
}

TEST_CASE(
    "agent: SIGUSR1 in --signals_to_handle goes to the workers, then the job is shut down "
    "as torch's agent does") {
  Scratch s;
  ChildProcess agent(
      ctrun_args({"--standalone", "--nproc_per_node=2", "--signals_to_handle=SIGTERM,SIGUSR1",
                  TEST_WORKER_PATH, "usr1", s.path("out")}),
      s.path("agent.log"));
  REQUIRE(wait_exists(s.path("out.0.ready"), 20s));
  REQUIRE(wait_exists(s.path("out.1.ready"), 20s));
  agent.signal(SIGUSR1);
  auto code = agent.wait(20s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code.has_value());
  CHECK(*code == 1);  // torchrun's SignalException: the agent was stopped by a handled signal
  // Each worker got SIGUSR1 and did its work (a checkpoint on Slurm's warning) before the end.
  CHECK(fs::exists(s.path("out.0")));
  CHECK(fs::exists(s.path("out.1")));
  CHECK(read_file(s.path("agent.log")).find("received SIGUSR1: stopping workers") !=
        std::string::npos);
}

TEST_CASE(
    "agent: ctrun status shows a running job's nodes, ranks and restarts, as a table and JSON") {
  Scratch s;
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH);
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(port);
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        ctrun_args({"--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d", endpoint,
                    "--rdzv_id=watched", "--max_restarts=3", TEST_WORKER_PATH, "sleep", "30"}),
        s.path("agent" + std::to_string(i) + ".log")));
  }
  auto status = [&](std::vector<std::string> args, const std::string& out) {
    args.insert(args.begin(), {"status", endpoint});
    ChildProcess p(ctrun_args(args), s.path(out));
    return p.wait(20s);
  };
  // Bounded wait until the round has formed with both nodes.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  nlohmann::json job;
  while (std::chrono::steady_clock::now() < deadline) {
    fs::remove(s.path("status.json"));
    if (status({"--rdzv_id=watched", "--json"}, "status.json") == 0) {
      job = nlohmann::json::parse(read_file(s.path("status.json")));
      if (job["formed"] == true && job["nodes"].size() == 2) break;
    }
    std::this_thread::sleep_for(100ms);
  }
  INFO(read_file(s.path("agent0.log")) + read_file(s.path("agent1.log")));
  REQUIRE(job["formed"] == true);
  CHECK(job["state"] == "running");
  CHECK(job["restarts"] == 0);
  CHECK(job["max_restarts"] == 3);
  CHECK(job["restarts_left"] == 3);
  REQUIRE(job["nodes"].size() == 2);
  CHECK(job["nodes"][0]["group_rank"] == 0);
  CHECK(job["nodes"][1]["group_rank"] == 1);
  CHECK(job["nodes"][0]["host"] == "127.0.0.1");
  CHECK(job["nodes"][0]["local_world_size"] == 2);
  CHECK(job["nodes"][0]["last_heartbeat_age_s"].get<double>() < 10);

  REQUIRE(status({"--rdzv_id=watched"}, "status.txt") == 0);
  const std::string table = read_file(s.path("status.txt"));
  CHECK(table.find("job watched: running, round 0 (formed), nodes 2 (min 2, max 2), restarts 0 "
                   "of 3 (3 left)") != std::string::npos);
  CHECK(table.find("GROUP_RANK") != std::string::npos);

  REQUIRE(status({}, "jobs.txt") == 0);
  const std::string jobs = read_file(s.path("jobs.txt"));
  CHECK(jobs.find("watched") != std::string::npos);
  CHECK(jobs.find("ctrun-status") == std::string::npos);  // the asker's own empty job
  CHECK(status({"--rdzv_id=nonesuch"}, "none.txt") == 1);
  CHECK(read_file(s.path("none.txt")).find("no job 'nonesuch'") != std::string::npos);
  CHECK(status({"--rdzv_id=watched", "--timeout=x"}, "bad.txt") == 2);
  for (auto& a : agents) a->signal(SIGTERM);
  for (auto& a : agents) CHECK(a->wait(20s).has_value());
}

TEST_CASE("agent: SIGKILLed agent takes its workers along, the other node goes on alone") {
  Scratch s;
  // The rendezvous runs apart from both agents (is_host=false): killing one must not take it.
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH);
  // Round 0 forms only with both (max); the re-formed round needs no last call.
  auto node = [&](const std::string& log) {
    return start_elastic_node(s, port, "survive", "last_call_timeout=60",
                              {"until_alone", s.path("pids")}, log);
  };
  auto victim = node("victim.log");
  auto survivor = node("survivor.log");
  REQUIRE(wait_exists(s.path("pids.0"), 20s));
  REQUIRE(wait_exists(s.path("pids.1"), 20s));
  // The victim's worker: its rank is in the victim's "round 0: ... ranks R..R" line.
  const std::string victim_log = read_file(s.path("victim.log"));
  const int victim_rank = victim_log.find("ranks 0..0") != std::string::npos ? 0 : 1;
  std::istringstream in(read_file(s.path("pids." + std::to_string(victim_rank))));
  pid_t worker = 0;
  in >> worker;
  REQUIRE(worker > 0);
  REQUIRE(alive(worker));
  victim->signal(SIGKILL);
  REQUIRE(victim->wait(5s).has_value());
  // Its worker dies with it (PR_SET_PDEATHSIG): gone or a zombie awaiting init.
  auto running = [](pid_t p) {
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string content;
    std::getline(stat, content);
    return !content.empty() && content.find(") Z") == std::string::npos;
  };
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (running(worker) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  CHECK_FALSE(running(worker));
  // The survivor re-forms alone, at once: the daemon sees the agent's connection close. (Within
  // 8 s, less than the 15 s of missed keep-alives, so a descriptor leaked into a worker that
  // keeps the connection open fails this test.)
  const auto reform = std::chrono::steady_clock::now() + 8s;
  while (read_file(s.path("survivor.log")).find("round 1: group rank 0 of 1") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < reform) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(std::chrono::steady_clock::now() < reform);
  // ... and, alone, its worker finishes: the job succeeds.
  auto code = survivor->wait(15s);
  const std::string survivor_log = read_file(s.path("survivor.log"));
  INFO(survivor_log);
  CHECK(survivor_log.find("round 1: group rank 0 of 1") != std::string::npos);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("agent: the daemon SIGKILLed and restarted with --state_dir, the job goes on") {
  Scratch s;
  const std::vector<std::string> state = {"--state_dir", s.path("state")};
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH, state, free_port(), "ctrund1");
  auto node = [&](const std::string& log) {
    // Workers outlive the daemon's absence: 6 s of work, then their environment to a file.
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/bin/env", "CTRUN_TEST_OUT=" + s.path("out"), CTRUN_PATH, "--nnodes=2",
            "--nproc_per_node=1", "--rdzv_backend=c10d",
            "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=durable",
            "--rdzv_conf=is_host=false,keep_alive_interval=1", TEST_WORKER_PATH, "sleep", "6"},
        s.path(log));
  };
  auto a = node("a.log");
  auto b = node("b.log");
  REQUIRE(wait_for_text(s.path("a.log"), "round 0: group rank", 20s));
  REQUIRE(wait_for_text(s.path("b.log"), "round 0: group rank", 20s));

  daemon->signal(SIGKILL);
  REQUIRE(daemon->wait(5s).has_value());
  const auto killed = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1s);
  start_ctrund(daemon, s, CTRUND_PATH, state, port, "ctrund2");
  REQUIRE(wait_for_text(s.path("a.log"), "reconnected to the rendezvous: round 0", 20s));
  REQUIRE(wait_for_text(s.path("b.log"), "reconnected to the rendezvous: round 0", 20s));
  const double back =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  WARN("daemon down 1.0 s; both agents back " << back << " s after the SIGKILL");

  auto code_a = a->wait(30s);
  auto code_b = b->wait(30s);
  INFO(read_file(s.path("a.log")) + read_file(s.path("b.log")) + read_file(s.path("ctrund2.log")));
  REQUIRE(code_a.has_value());
  REQUIRE(code_b.has_value());
  CHECK(*code_a == 0);
  CHECK(*code_b == 0);
  // The workers of round 0 ran to their end: no restart, no new round.
  CHECK(read_env_file(s.path("out.0"))["TORCHELASTIC_RESTART_COUNT"] == "0");
  CHECK(read_env_file(s.path("out.1"))["TORCHELASTIC_RESTART_COUNT"] == "0");
  const std::string restored = read_file(s.path("ctrund2.log"));
  CHECK(restored.find("restored 1 job(s)") != std::string::npos);
  CHECK(restored.find("succeeded: every node succeeded") != std::string::npos);
  CHECK(restored.find("round 1") == std::string::npos);
  CHECK(back < 10);
}

TEST_CASE("agent: a late second node joins a running 1:2 job without spending restarts") {
  Scratch s;
  std::unique_ptr<ChildProcess> daemon;
  const std::uint16_t port = start_ctrund(daemon, s, CTRUND_PATH);
  auto node = [&](const std::string& log) {
    return start_elastic_node(s, port, "grow", "last_call_timeout=0.2", {"sleep", "2"}, log);
  };
  ::setenv("CTRUN_TEST_OUT", s.path("env").c_str(), 1);
  auto first = node("first.log");
  const auto formed = std::chrono::steady_clock::now() + 15s;
  while (read_file(s.path("first.log")).find("round 0:") == std::string::npos &&
         std::chrono::steady_clock::now() < formed) {
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(read_file(s.path("first.log")).find("round 0: group rank 0 of 1") != std::string::npos);
  auto second = node("second.log");
  ::unsetenv("CTRUN_TEST_OUT");
  auto a = first->wait(30s);
  auto b = second->wait(30s);
  INFO(read_file(s.path("first.log")) + read_file(s.path("second.log")));
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(*a == 0);
  CHECK(*b == 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto env = read_env_file(s.path("env." + std::to_string(rank)));
    CHECK(env["WORLD_SIZE"] == "2");
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");  // growing is not a restart
  }
}

TEST_CASE("agent: log files, tee, redirects and console prefixes") {
  Scratch s;
  ChildProcess agent(
      ctrun_args({"--standalone", "--nproc_per_node=2", "--rdzv_id=ignored", "--log_dir",
                  s.path("logs"), "--redirects=0:1", "--tee=1:3", TEST_WORKER_PATH, "print"}),
      s.path("agent.log"));
  auto code = agent.wait(30s);
  const std::string console = read_file(s.path("agent.log"));
  INFO(console);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // Rank 0's stdout went to its file only; rank 1's both streams to file and console.
  CHECK(console.find("[default0]:hello from 0") == std::string::npos);
  CHECK(console.find("[default0]:to stderr") != std::string::npos);
  CHECK(console.find("[default1]:hello from 1\n[default1]:second line\n") != std::string::npos);
  CHECK(console.find("[default1]:to stderr") != std::string::npos);
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(s.path("logs"))) runs.push_back(entry.path());
  REQUIRE(runs.size() == 1);  // LOG_DIR/RUN_ID
  const fs::path attempt = runs[0] / "attempt_0";
  CHECK(read_file((attempt / "0" / "stdout.log").string()) == "hello from 0\nsecond line\n");
  CHECK_FALSE(fs::exists(attempt / "0" / "stderr.log"));
  CHECK(read_file((attempt / "1" / "stdout.log").string()) == "hello from 1\nsecond line\n");
  CHECK(read_file((attempt / "1" / "stderr.log").string()) == "to stderr\n");
}

TEST_CASE("agent: local_ranks_filter keeps other ranks off the console") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=3", "--local_ranks_filter=1",
                                 TEST_WORKER_PATH, "print"}),
                     s.path("agent.log"));
  REQUIRE(agent.wait(30s) == std::optional<int>(0));
  const std::string console = read_file(s.path("agent.log"));
  CHECK(console.find("[default1]:hello from 1") != std::string::npos);
  CHECK(console.find("[default0]:") == std::string::npos);
  CHECK(console.find("[default2]:") == std::string::npos);
}

TEST_CASE("agent: bad flags and a missing program are clear one-line errors") {
  Scratch s;
  std::vector<std::vector<std::string>> bad{{"--nnodes=x", "train.py"}, {"--standalone"}};
  // "gpu" is an error only where no GPU is visible (on a GPU machine it is the device count).
  if (!std::filesystem::exists("/dev/nvidia0")) bad.push_back({"--nproc_per_node=gpu", "train.py"});
  for (const auto& args : bad) {
    ChildProcess p(ctrun_args(args), s.path("bad.log"));
    REQUIRE(p.wait(10s) == std::optional<int>(2));
  }
  const std::string out = read_file(s.path("bad.log"));
  CHECK(out.find("ctrun: error: --nnodes") != std::string::npos);
  CHECK(out.find("ctrun: error: missing the training program") != std::string::npos);
  ChildProcess missing(ctrun_args({"--standalone", "/nonexistent/trainer"}), s.path("missing.log"));
  REQUIRE(missing.wait(10s) == std::optional<int>(1));
  CHECK(read_file(s.path("missing.log")).find("/nonexistent/trainer") != std::string::npos);
}

TEST_CASE("agent: a worker program that cannot start is told in plain words") {
  Scratch s;
  const std::string not_executable = s.path("not_executable.sh");
  { std::ofstream(not_executable) << "#!/bin/sh\necho hi\n"; }
  const std::string not_a_program = s.path("data.txt");
  { std::ofstream(not_a_program) << "just text\n"; }
  std::filesystem::permissions(not_a_program, std::filesystem::perms::owner_all);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"/nonexistent/trainer", "No such file or directory"},
      {not_executable, "Permission denied (not executable: chmod +x"},
      {not_a_program, "Exec format error (not a program this machine runs"}};
  for (const auto& [program, why] : cases) {
    INFO(program);
    ChildProcess p(ctrun_args({"--standalone", "--no-python", program}), s.path("start.log"));
    REQUIRE(p.wait(20s) == std::optional<int>(1));
    const std::string out = read_file(s.path("start.log"));
    INFO(out);
    CHECK(out.find("ctrun: error: cannot start '" + program + "': " + why) != std::string::npos);
    CHECK(out.find("default_launcher") == std::string::npos);  // no library internals
    CHECK(out.find("[system:") == std::string::npos);
  }
}

TEST_CASE("agent: the open-file limit is raised within the hard limit or named when too low") {
  Scratch s;
  const std::string script = s.path("limit.sh");
  { std::ofstream(script) << "#!/bin/sh\necho \"soft limit $(ulimit -Sn)\"\n"; }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  const std::string ctrun_line = std::string(CTRUN_PATH) +
                                 " --standalone --nproc_per_node=8 --tee 3 --log_dir " +
                                 s.path("logs") + " --no-python " + script;
  // Soft 48, hard 4096: the agent raises its own and its workers keep the user's 48.
  ChildProcess raised({"/bin/sh", "-c", "ulimit -Sn 48 && ulimit -Hn 4096 && exec " + ctrun_line},
                      s.path("raised.log"));
  REQUIRE(raised.wait(60s) == std::optional<int>(0));
  const std::string ok = read_file(s.path("raised.log"));
  INFO(ok);
  for (int rank = 0; rank < 8; ++rank) {
    CHECK(ok.find("[default" + std::to_string(rank) + "]:soft limit 48") != std::string::npos);
  }
  // Hard 48: not enough for 8 workers with two log files each; said with the numbers.
  ChildProcess refused({"/bin/sh", "-c", "ulimit -n 48 && exec " + ctrun_line},
                       s.path("refused.log"));
  REQUIRE(refused.wait(60s) == std::optional<int>(1));
  const std::string out = read_file(s.path("refused.log"));
  INFO(out);
  CHECK(out.find("ctrun: error: 8 workers need about ") != std::string::npos);
  CHECK(out.find("ulimit -n allows 48 (hard limit 48): raise it, e.g. ulimit -n ") !=
        std::string::npos);
}

TEST_CASE("agent: a log file that cannot be written is named once and the console keeps it all") {
  Scratch s;
  // A 16 KiB tmpfs as --log_dir, in a mount namespace of the agent's own (root only). The
  // node's free-space check is off: the disk fills while the job runs, as it would in life.
  ChildProcess probe({"/usr/bin/unshare", "-m", "/bin/true"}, "/dev/null");
  if (probe.wait(10s) != std::optional<int>(0)) {
    CTRUN_SKIP("needs root for a mount namespace with a small tmpfs (unshare -m)");
  }
  const std::string logs = s.path("small");
  std::filesystem::create_directories(logs);
  const std::string script = s.path("writer.sh");
  {
    std::ofstream(script) << "#!/bin/sh\ni=0\nwhile [ $i -lt 2000 ]; do\n"
                          << "  echo \"line $i of a worker that fills the disk with its output\"\n"
                          << "  i=$((i+1))\ndone\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  ChildProcess agent({"/usr/bin/unshare", "-m", "/bin/sh", "-c",
                      "mount -t tmpfs -o size=16k tmpfs " + logs + " && exec " + CTRUN_PATH +
                          " --standalone --log_dir " + logs +
                          " --health_min_free_mib=0 --tee 3 --no-python " + script},
                     s.path("agent.log"));
  REQUIRE(agent.wait(60s) == std::optional<int>(0));
  const std::string out = read_file(s.path("agent.log"));
  // Every line still reached the console.
  CHECK(out.find("[default0]:line 0 of a worker") != std::string::npos);
  CHECK(out.find("[default0]:line 1999 of a worker") != std::string::npos);
  // The cut-short file is named once, with the cause, and again at the job's end.
  const std::string said = "ctrun: error: worker rank 0 (local rank 0): writing its log file '";
  const auto first = out.find(said);
  REQUIRE(first != std::string::npos);
  CHECK(out.find(said, first + 1) == std::string::npos);
  CHECK(out.find("/attempt_0/0/stdout.log' failed: No space left on device", first) !=
        std::string::npos);
  CHECK(out.find("ctrun: warning: 1 log files are cut short") != std::string::npos);
}

TEST_CASE("agent: a real PyTorch DDP script (gloo, env://) trains to the end") {
  Scratch s;
  SystemPython python;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=2", DDP_SCRIPT_PATH, "--epochs",
                                 "2", "--samples", "1024"}),
                     s.path("agent.log"));
  auto code = agent.wait(120s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(log.find("[default0]:epoch 1: loss=") != std::string::npos);
  CHECK(log.find("[default0]:done: 2 epochs, world size 2, parameters identical") !=
        std::string::npos);
}

TEST_CASE(
    "agent: with --fault_tolerance=step a failed worker is replaced alone, its peer keeps its "
    "PID") {
  Scratch s;
  ChildProcess agent(
      ctrun_args({"--standalone", "--nproc_per_node=2", "--max_restarts=1",
                  "--fault_tolerance=step", TEST_WORKER_PATH, "ft_once", s.path("starts")}),
      s.path("agent.log"));
  auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // Three processes in all: local rank 0 once, local rank 1 twice (restart counts 0 then 1).
  std::map<std::string, std::vector<std::string>> starts;  // local rank -> "pid restart"
  std::istringstream lines(read_file(s.path("starts")));
  for (std::string rank, pid, restart; lines >> rank >> pid >> restart;) {
    starts[rank].push_back(restart);
  }
  CHECK(starts["0"] == std::vector<std::string>{"0"});
  CHECK(starts["1"] == std::vector<std::string>{"0", "1"});
  CHECK(log.find("replacing worker rank 1 (local rank 1; 1 of 1 restarts); the others run on") !=
        std::string::npos);
  CHECK(log.find("restarting the job") == std::string::npos);
}

TEST_CASE("agent: a rendezvous port held by something else for a while is hosted once it frees") {
  Scratch s;
  // A socket bound to the endpoint's port and not listening (no SO_REUSEADDR): the agent cannot
  // host there, and its connects are refused. The agent used to wait for a host that never came.
  const int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // not the agent's
  REQUIRE(held >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::uint16_t port = 0;
  for (int attempt = 0; attempt < 20 && port == 0; ++attempt) {
    const std::uint16_t candidate = free_port();
    address.sin_port = htons(candidate);
    if (::bind(held, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) port = candidate;
  }
  REQUIRE(port != 0);
  ChildProcess agent(ctrun_args({"--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                 "--rdzv_id=held", TEST_WORKER_PATH, "exit", "0"}),
                     s.path("agent.log"));
  std::this_thread::sleep_for(1500ms);
  ::close(held);
  auto code = agent.wait(20s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(log.find("hosting the rendezvous on 127.0.0.1:" + std::to_string(port)) !=
        std::string::npos);
}
