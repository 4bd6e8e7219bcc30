// A node's health checks before it joins (--health_check, free space): an unhealthy node stays
// out, says why each time and joins once healthy; an elastic job forms without it; a stop
// signal ends it at once; a node unhealthy for the join timeout gives up with the reason.
#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

#include "catch.h"
#include "ctrun/rendezvous/json.h"
#include "ctrund_daemon.h"
#include "event_log.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

TEST_CASE("node health: a failing --health_check keeps the node out until it passes") {
  ScratchDir s("node_health_command");
  const std::string ready = s.path("ready");
  ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=1", "--event_log",
                      s.path("events"), "--health_check",
                      "echo checking the scratch disk; test -e " + ready +
                          " || { echo scratch disk not mounted; exit 1; }",
                      "--health_check_interval=0.3", TEST_WORKER_PATH, "exit", "0"},
                     s.path("agent.log"));
  // Two failed checks, each said; then the check passes and the job runs.
  REQUIRE(wait_for_text(s.path("agent.log"), "checking again in 0.3 s", 20s));
  std::this_thread::sleep_for(500ms);
  std::ofstream(ready) << "yes\n";
  const auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code);
  CHECK(*code == 0);
  CHECK(log.find("health check: checking the scratch disk") != std::string::npos);
  CHECK(log.find("is unhealthy, not joining: health check command: 'echo checking the scratch "
                 "disk; test -e " +
                 ready +
                 " || { echo scratch disk not mounted; exit 1; }' failed: scratch disk not "
                 "mounted; checking again in 0.3 s") != std::string::npos);
  CHECK(count_of(log, "is unhealthy, not joining") >= 2);
  CHECK(log.find("is healthy again: joining") != std::string::npos);
  // No worker ran before the node was healthy.
  CHECK(log.find("is healthy again: joining") < log.find("round 0"));
  CHECK(events_named(s.path("events"), "health_check_failed").size() >= 2);
  CHECK(events_named(s.path("events"), "health_check_passed").size() == 1);
}

TEST_CASE("node health: an elastic job forms without an unhealthy node, which a SIGTERM ends") {
  ScratchDir s("node_health_elastic");
  CtrundDaemon daemon;
  auto agent = [&](const std::string& name, std::vector<std::string> health) {
    std::vector<std::string> argv = {CTRUN_PATH,
                                     "--nnodes=1:2",
                                     "--nproc_per_node=1",
                                     "--rdzv_backend=c10d",
                                     "--rdzv_endpoint=127.0.0.1:" + std::to_string(daemon.port()),
                                     "--rdzv_id=elastic",
                                     "--rdzv_conf=last_call_timeout=1"};
    argv.insert(argv.end(), health.begin(), health.end());
    argv.insert(argv.end(), {TEST_WORKER_PATH, "exit", "0"});
    return std::make_unique<ChildProcess>(argv, s.path(name + ".log"));
  };
  auto sick = agent(
      "sick", {"--health_check", "echo GPU 3 missing; exit 1", "--health_check_interval=0.5"});
  REQUIRE(wait_for_text(s.path("sick.log"), "is unhealthy, not joining", 20s));
  auto well = agent("well", {});
  const auto well_code = well->wait(30s);
  INFO(read_file(s.path("well.log")));
  REQUIRE(well_code);
  CHECK(*well_code == 0);
  CHECK(read_file(s.path("well.log")).find("ranks 0..0 of world size 1") != std::string::npos);
  // Still out, still saying why (and every 5 s how long); a stop signal ends it at once (no
  // workers yet: by the signal).
  CHECK(sick->wait(0ms) == std::nullopt);
  CHECK(wait_for_text(s.path("sick.log"),
                      "this node is unhealthy (health check command: 'echo GPU 3 missing; exit 1' "
                      "failed: GPU 3 missing); join timeout 600 s",
                      10s));
  const auto stop = std::chrono::steady_clock::now();
  sick->signal(SIGTERM);
  const auto sick_code = sick->wait(10s);
  const std::string sick_log = read_file(s.path("sick.log"));
  INFO(sick_log);
  REQUIRE(sick_code);
  CHECK(*sick_code == 128 + SIGTERM);
  CHECK(std::chrono::steady_clock::now() - stop < 3s);
  CHECK(sick_log.find("health check command: 'echo GPU 3 missing; exit 1' failed: GPU 3 missing") !=
        std::string::npos);
  CHECK(sick_log.find("round 0") == std::string::npos);
}

TEST_CASE("node health: too little free space for the join timeout gives up with the numbers") {
  ScratchDir s("node_health_space");
  // A minimum no disk here meets (1 PiB).
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=1", "--rdzv_conf=join_timeout=2", "--log_dir",
       s.path("logs"), "--health_min_free_mib=1073741824", "--health_check_interval=0.5",
       TEST_WORKER_PATH, "exit", "0"},
      s.path("agent.log"));
  const auto code = agent.wait(30s);
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  REQUIRE(code);
  CHECK(*code == 1);
  CHECK(log.find("is unhealthy, not joining: free space: " + s.path("logs")) != std::string::npos);
  CHECK(log.find("MiB free, below 1073741824 MiB (--health_min_free_mib)") != std::string::npos);
  CHECK(log.find("stayed unhealthy for the join timeout (2 s): free space: ") != std::string::npos);
  CHECK(log.find("round 0") == std::string::npos);
}
