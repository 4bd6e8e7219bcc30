// Before its workers exist (reaching, connecting, handshaking, waiting for peers) the agent
// answers a handled signal in every phase, and says what it waits for. A signal ends it within
// the bound, as torchrun's end (by the signal: torchrun handles signals only once it has started
// workers), leaving no temporary directory, and telling a daemon that knows it that it left.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "ctrun/launcher/options.h"
#include "process.h"

using namespace std::chrono_literals;
using namespace ctrun::testing;
namespace fs = std::filesystem;

namespace {

constexpr auto kBound = 2s;  // 1 s promised; slack for a loaded 2-core machine

// Starts ctrun with `args` (TMPDIR in the scratch directory), lets it reach the phase, signals
// it, and checks how it ends.
void signal_in_phase(const ScratchDir& s, const std::vector<std::string>& args, int signo,
                     const std::string& log_name) {
  const std::string tmp = s.path("tmp-" + log_name);
  fs::create_directories(tmp);
  std::vector<std::string> argv = {"/usr/bin/env", "TMPDIR=" + tmp, CTRUN_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {TEST_WORKER_PATH, "sleep", "30"});
  const std::string log = s.path(log_name + ".log");
  ChildProcess agent(argv, log);
  std::this_thread::sleep_for(1500ms);  // well inside the phase: its waits are 10 s and more
  INFO(read_file(log));
  REQUIRE_FALSE(agent.wait(0ms).has_value());  // still waiting, as it should
  const auto sent = std::chrono::steady_clock::now();
  agent.signal(signo);
  auto code = agent.wait(10s);
  const auto took = std::chrono::steady_clock::now() - sent;
  INFO(read_file(log));
  REQUIRE(code.has_value());
  // As torchrun, whose handlers come with its first workers: ended by the signal itself.
  CHECK(*code == 128 + signo);
  CHECK(took < kBound);
  CHECK(read_file(log).find("received " + ctrun::launcher::signal_name(signo)) !=
        std::string::npos);
  CHECK(fs::is_empty(tmp));  // its temporary log root is gone
}

}  // namespace

TEST_CASE("agent signals: a refused endpoint while the agent retries the connect") {
  ScratchDir s("agent-signal");
  const int signo = GENERATE(SIGTERM, SIGINT, SIGHUP, SIGQUIT);
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  signal_in_phase(s,
                  {"--nnodes=1", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                   "--rdzv_conf=is_host=false"},
                  signo, "refused");
}

TEST_CASE("agent signals: an endpoint that accepts and never answers, during the handshake") {
  ScratchDir s("agent-signal");
  SilentListener silent;
  const int signo = GENERATE(SIGTERM, SIGINT);
  signal_in_phase(
      s,
      {"--nnodes=1", "--rdzv_backend=c10d",
       "--rdzv_endpoint=127.0.0.1:" + std::to_string(silent.port()), "--rdzv_conf=is_host=false"},
      signo, "silent");
}

TEST_CASE("agent signals: an endpoint whose name does not resolve") {
  ScratchDir s("agent-signal");
  const int signo = GENERATE(SIGTERM, SIGINT);
  signal_in_phase(s,
                  {"--nnodes=1", "--rdzv_backend=c10d",
                   "--rdzv_endpoint=ctrun-no-such-host.invalid:29400", "--rdzv_conf=is_host=false"},
                  signo, "unresolved");
}

TEST_CASE("agent signals: a static node 1 started before node 0") {
  ScratchDir s("agent-signal");
  const int signo = GENERATE(SIGTERM, SIGHUP);
  signal_in_phase(s,
                  {"--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.1",
                   "--master_port=" + std::to_string(free_port())},
                  signo, "static");
}

TEST_CASE("agent signals: a peer that never comes and the daemon is told the node left") {
  ScratchDir s("agent-signal");
  const int signo = GENERATE(SIGTERM, SIGINT, SIGHUP, SIGQUIT);
  std::unique_ptr<ChildProcess> daemon;
  const std::string port = std::to_string(start_ctrund(daemon, s, CTRUND_PATH));
  signal_in_phase(s,
                  {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + port,
                   "--rdzv_id=lonely", "--rdzv_conf=is_host=false"},
                  signo, "lonely");
  // Gone because it said so, not joined and later lost.
  INFO(read_file(s.path("ctrund.log")));
  CHECK(wait_for_text(s.path("ctrund.log"), "left: left", 5s));
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s).has_value());
}

namespace {

// Starts ctrun with `args`, waits (bounded) for `line` in its log, then stops it.
void says_while_waiting(const ScratchDir& s, const std::vector<std::string>& args,
                        const std::string& line) {
  std::vector<std::string> argv = {CTRUN_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {TEST_WORKER_PATH, "sleep", "30"});
  const std::string log = s.path("waiting.log");
  ChildProcess agent(argv, log);
  const bool said = wait_for_text(log, line, 9s);  // the first line comes after 5 s
  agent.signal(SIGTERM);
  CHECK(agent.wait(10s).has_value());
  INFO(read_file(log));
  CHECK(said);
}

}  // namespace

TEST_CASE("agent waits: a refused endpoint is named with the cause while the agent retries") {
  ScratchDir s("agent-waits");
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_port());
  says_while_waiting(s,
                     {"--nnodes=1", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                      "--rdzv_conf=is_host=false"},
                     "still connecting to the rendezvous at " + endpoint +
                         " after 5 s (last attempt: connect to " + endpoint +
                         ": Connection refused); trying for up to 600 s");
}

TEST_CASE("agent waits: an endpoint that never answers is named as such") {
  ScratchDir s("agent-waits");
  SilentListener silent;
  const std::string endpoint = "127.0.0.1:" + std::to_string(silent.port());
  says_while_waiting(
      s,
      {"--nnodes=1", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
       "--rdzv_conf=is_host=false"},
      "still connecting to the rendezvous at " + endpoint + " after 5 s (no answer yet)");
}

TEST_CASE("agent waits: a round that does not form is named while the agent waits") {
  ScratchDir s("agent-waits");
  std::unique_ptr<ChildProcess> daemon;
  const std::string port = std::to_string(start_ctrund(daemon, s, CTRUND_PATH));
  const std::string endpoint = "127.0.0.1:" + port;
  says_while_waiting(s,
                     {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
                      "--rdzv_id=waiting", "--rdzv_conf=is_host=false"},
                     "waiting for the round to form at " + endpoint +
                         " for 5 s (2 to 2 nodes; join timeout 600 s)");
  daemon->signal(SIGTERM);
  CHECK(daemon->wait(10s).has_value());
}

TEST_CASE("agent: --stop_on_stdin_close stops the workers when standard input ends") {
  ScratchDir s("stdin_close");
  // The pipe's writer (sleep) exits after a second: the agent's input ends while its workers
  // run, and it stops them as on SIGTERM, ending as it does then (exit 1, torchrun's code).
  const std::string command = "sleep 1 | exec " + std::string(CTRUN_PATH) +
                              " --stop_on_stdin_close --standalone --nproc_per_node=2 " +
                              TEST_WORKER_PATH + " grandchild " + s.path("pids");
  ChildProcess agent({"/bin/bash", "-c", command}, s.path("agent.log"));
  std::vector<pid_t> workers;  // each worker and the child it left
  for (int rank = 0; rank < 2; ++rank) {
    auto line = wait_for_file(s.path("pids." + std::to_string(rank)), 20s);
    INFO(read_file(s.path("agent.log")));
    REQUIRE(line);
    std::istringstream pids(*line);
    for (long pid; pids >> pid;) workers.push_back(static_cast<pid_t>(pid));
  }
  CHECK(workers.size() == 4);
  const auto rc = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 1);
  CHECK(log.find("standard input closed (--stop_on_stdin_close): stopping") != std::string::npos);
  for (pid_t pid : workers) CHECK(::kill(pid, 0) != 0);
}

TEST_CASE("agent: ctrun --hosts --dry_run prints each host's ssh command and starts nothing") {
  ScratchDir s("dry_run");
  std::ofstream(s.path("hostfile")) << "127.0.0.1 slots=2\n127.0.0.2 slots=4  # the second\n";
  ChildProcess launcher({"/usr/bin/env", "-C", s.path(""), "TMPDIR=" + s.path(""),
                         "NCCL_DEBUG=WARN", CTRUN_PATH, "--hostfile", "hostfile", "--exclude",
                         "127.0.0.2:0", "--dry_run", "--max_restarts=2", "train.py", "--lr", "0.1"},
                        s.path("out.log"));
  const auto rc = launcher.wait(20s);
  const std::string out = read_file(s.path("out.log"));
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(count_of(out, "\n") == 2);  // a line per host, nothing else
  CHECK(out.find("127.0.0.1: ssh -T -o BatchMode=yes") == 0);
  CHECK(out.find("--nnodes=2:2 --nproc_per_node=2 --rdzv_backend=c10d") != std::string::npos);
  // Host 2 without its slot 0: three workers, on GPUs 1-3.
  CHECK(out.find("CUDA_VISIBLE_DEVICES=1,2,3") != std::string::npos);
  CHECK(out.find("--nproc_per_node=3") != std::string::npos);
  CHECK(out.find("NCCL_DEBUG=WARN") != std::string::npos);
  CHECK(out.find("--stop_on_stdin_close --max_restarts=2 train.py --lr 0.1") != std::string::npos);
}

TEST_CASE("agent signals: the file timer's pipe goes with an agent a signal ends") {
  ScratchDir s("signal_timer_pipe");
  const std::string pipe = s.path("timer_pipe");
  // A round that waits for a second node: the signal ends the agent itself (no destructor runs).
  ChildProcess agent(
      {"/usr/bin/env", "TORCHELASTIC_ENABLE_FILE_TIMER=1", "TORCHELASTIC_TIMER_FILE=" + pipe,
       CTRUN_PATH, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
       "--rdzv_endpoint=127.0.0.1:" + std::to_string(free_port()), TEST_WORKER_PATH, "sleep", "30"},
      s.path("agent.log"));
  REQUIRE(wait_for_text(s.path("agent.log"), "joined round 0 (1 of 2", 30s));
  REQUIRE(fs::is_fifo(pipe));
  agent.signal(SIGINT);
  const auto code = agent.wait(30s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code.has_value());
  CHECK(*code == 128 + SIGINT);
  CHECK_FALSE(fs::exists(pipe));
}
