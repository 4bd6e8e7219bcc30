// Hang reports across the ranks of a job: two agents on a ctrund, four Python gloo workers
// (tests/python/hang_in_own_function.py); rank 3 stops in a function of its own while the other
// three wait for it in all_reduce. The report that --worker_timeout sets off, and the one that
// `ctrun status --dump` asks for, both name rank 3.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "catch.h"
#include "ctrun/rendezvous/json.h"
#include "ctrund_daemon.h"
#include "event_log.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
using Json = ctrun::rendezvous::Json;

namespace {

// Two agents of job `job`, 2 workers each; rank 3 hangs before its all_reduce of step 5.
std::vector<std::unique_ptr<ChildProcess>> start_job(const ScratchDir& s, std::uint16_t port,
                                                     const std::string& job,
                                                     const std::string& worker_timeout) {
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    const std::string n = std::to_string(node);
    agents.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{
            CTRUN_PATH, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
            "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=" + job,
            "--max_restarts=0", "--worker_timeout=" + worker_timeout, "--log_dir",
            s.path("logs." + n), "--event_log", s.path("events." + n),
            HANG_IN_OWN_FUNCTION_SCRIPT_PATH, "3", "5"},
        s.path("agent." + n + ".log")));
  }
  return agents;
}

// Each of the job's ranks has reported step 4 (the step before rank 3's hang), bounded.
bool reached_step_4(const ScratchDir& s, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    int at = 0;
    for (int node = 0; node < 2; ++node) {
      std::error_code ec;  // the log directory is made as the workers start
      for (std::filesystem::recursive_directory_iterator
               it(s.path("logs." + std::to_string(node)), ec),
           end;
           !ec && it != end; it.increment(ec)) {
        const auto& f = *it;
        // The record's first number is the step ("4", then the waits, padded to its width).
        if (f.path().filename() != "heartbeat") continue;
        const std::string record = read_file(f.path().string());
        if (!record.empty() && std::atoi(record.c_str()) == 4) ++at;
      }
    }
    if (at == 4) return true;
    std::this_thread::sleep_for(200ms);
  }
  return false;
}

}  // namespace

TEST_CASE(
    "hang reports: a rank stuck in a function of its own while the others wait in "
    "all_reduce is named when --worker_timeout fires") {
  ScratchDir s("hang_report_timeout");
  SystemPython python;
  CtrundDaemon daemon;
  auto agents = start_job(s, daemon.port(), "hung", "4");
  // Every rank stops beating (three wait for the fourth): both agents find hung workers, and
  // the job fails once the report is made.
  for (int node = 0; node < 2; ++node) CHECK(agents[node]->wait(120s) != 0);
  int reports = 0, sections = 0;
  std::string logs;  // both agents', for a failure of the checks after the loop
  for (int node = 0; node < 2; ++node) {
    const std::string log = read_file(s.path("agent." + std::to_string(node) + ".log"));
    logs += "---- agent " + std::to_string(node) + " ----\n" + log;
    INFO(log);
    for (const auto& e : events_named(s.path("events." + std::to_string(node)), "hang_report")) {
      ++reports;
      CHECK(e["suspects"] == Json::array({3}));
      const std::string file = e.value("file", "");
      REQUIRE_FALSE(file.empty());
      const Json report = Json::parse(read_file(file), nullptr, false);
      REQUIRE(report.is_object());
      CHECK(report["ranks"].size() == 4);
      CHECK(report["groups"][0]["ranks"] == Json::array({0, 1, 2}));
      CHECK(report["groups"][0]["function"] == "all_reduce");
      CHECK(report["groups"][0]["from"].get<std::string>().rfind("hang_in_own_function.py:", 0) ==
            0);
      CHECK(report["groups"][1]["function"] == "slow_data");
      CHECK(report["groups"][1]["step"] == 4);
    }
    if (log.find("hang report ") != std::string::npos) {
      CHECK(log.find("rank 3 stands apart: ranks 0-2 wait in all_reduce") != std::string::npos);
    }
    // The failure report (of the node whose worker's exit ended the job) has the section.
    if (log.find("Hang report (worker rank ") != std::string::npos) ++sections;
  }
  INFO(logs);
  CHECK(reports >= 1);
  CHECK(sections >= 1);
}

TEST_CASE(
    "hang reports: ctrun status --dump prints where every rank of a running job "
    "stands") {
  ScratchDir s("hang_report_dump");
  SystemPython python;
  CtrundDaemon daemon;
  auto agents = start_job(s, daemon.port(), "dumped", "600");
  REQUIRE(reached_step_4(s, 60s));
  std::this_thread::sleep_for(500ms);  // rank 3 in slow_data, the others in all_reduce
  ChildProcess status(
      {CTRUN_PATH, "status", "--rdzv_endpoint=127.0.0.1:" + std::to_string(daemon.port()),
       "--rdzv_id=dumped", "--dump", "--json"},
      s.path("dump.json"));
  REQUIRE(status.wait(40s) == 0);
  const Json report = Json::parse(read_file(s.path("dump.json")), nullptr, false);
  INFO(read_file(s.path("dump.json")));
  REQUIRE(report.is_object());
  CHECK(report["suspects"] == Json::array({3}));
  CHECK(report["missing_nodes"].empty());
  REQUIRE(report["ranks"].size() == 4);
  for (const auto& r : report["ranks"]) {
    CHECK(r.value("python_stacks", "").find("(most recent call first)") != std::string::npos);
  }
  // The job runs on: the stacks were taken without stopping a worker.
  for (auto& agent : agents) CHECK_FALSE(agent->wait(0ms).has_value());
  for (auto& agent : agents) agent->signal(SIGTERM);
  for (auto& agent : agents) CHECK(agent->wait(60s).has_value());
  for (int node = 0; node < 2; ++node) {
    CHECK(events_named(s.path("events." + std::to_string(node)), "hang_report").empty());
  }
}

TEST_CASE(
    "hang reports: the Flight Recorder reader takes each process group's last collective "
    "from a dump of torch's layout") {
  ScratchDir s("flight_recorder_reader");
  SystemPython python;
  // A dump as torch 2.x's NCCL Flight Recorder pickles it (plain dicts, lists and tuples).
  const std::string dump = s.path("nccl_trace_3");
  ChildProcess make(
      {"/usr/bin/python3", "-c",
       "import pickle, sys\n"
       "e = lambda seq, pg, op, state: {'record_id': seq, 'pg_id': int(pg), "
       "'process_group': (pg, 'default_pg'), 'collective_seq_id': seq, 'p2p_seq_id': 0, "
       "'op_id': seq, 'profiling_name': op, 'state': state, 'is_p2p': False, "
       "'frames': [{'name': 'all_reduce', 'filename': 'x.py', 'line': 1}]}\n"
       "d = {'version': '2.10', 'pg_config': {}, 'entries': [e(1, '0', 'nccl:broadcast', "
       "'completed'), e(2, '0', 'nccl:all_reduce', 'started'), e(1, '1', 'nccl:all_gather', "
       "'scheduled'), dict(e(9, '0', 'nccl:send', 'started'), is_p2p=True)]}\n"
       "pickle.dump(d, open(sys.argv[1], 'wb'), protocol=2)\n",
       dump},
      s.path("make.log"));
  REQUIRE(make.wait(30s) == 0);
  ChildProcess read({"/usr/bin/python3", std::string(CTRUN_PYTHON_HELPER_DIR) + "/ctrun_worker.py",
                     "fr_summary", dump, "3"},
                    s.path("summary.json"));
  REQUIRE(read.wait(30s) == 0);
  const Json summary = Json::parse(read_file(s.path("summary.json")), nullptr, false);
  INFO(read_file(s.path("summary.json")));
  REQUIRE(summary.is_object());
  CHECK(summary["rank"] == 3);
  REQUIRE(summary["last"].size() == 2);
  CHECK(summary["last"][0] ==
        Json{{"group", "0"}, {"seq", 2}, {"op", "nccl:all_reduce"}, {"state", "started"}});
  CHECK(summary["last"][1]["op"] == "nccl:all_gather");
}
