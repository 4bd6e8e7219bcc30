// NodeStacks (node_stacks.h) alone: this node's answer to a dump request, from workers the test
// plays. A "Python" worker is a shell that writes its stacks file on the stacks signal, as
// sitecustomize.py has faulthandler do; a hung worker's stacks come from the watchdog's.
#include "launcher/agent/node_stacks.h"

#include <boost/asio.hpp>

#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "catch.h"
#include "process.h"

using namespace ctrun::launcher;
using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// Workers that are whatever pids the test gives; nothing is started or stopped here.
class GivenPids final : public WorkerRunner {
 public:
  std::map<int, int> given;  // pids by local rank
  rdzv::Status start(std::vector<WorkerSpec>, ExitHandler) override { return rdzv::ok_status(); }
  void stop(int, std::chrono::milliseconds, std::function<void()> done) override { done(); }
  rdzv::Status restart(WorkerSpec) override { return rdzv::ok_status(); }
  void kill(int, int) override {}
  void kill_all() override {}
  void signal_process(int, int) override {}
  int running_pid(int local_rank) const override {
    auto it = given.find(local_rank);
    return it == given.end() ? 0 : it->second;
  }
  std::vector<std::string> stderr_tail(int) const override { return {}; }
  bool stderr_closed(int) const override { return true; }
  void write_stderr_note(int, const std::string&) override {}
  void set_log_error_handler(LogErrorHandler) override {}
  std::vector<WorkerExit> failures() const override { return {}; }
  std::size_t running() const override { return given.size(); }
  std::vector<int> pids() const override {
    std::vector<int> out;
    for (const auto& [rank, pid] : given) out.push_back(pid);
    return out;
  }
};

rdzv::Json take(asio::io_context& io, NodeStacks& stacks, const rdzv::RoundAssignment& round) {
  std::optional<rdzv::Json> answer;
  asio::co_spawn(io, stacks.take(round),
                 [&answer](std::exception_ptr, rdzv::Json j) { answer = std::move(j); });
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!answer && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(20ms);
  }
  REQUIRE(answer.has_value());
  return *answer;
}

}  // namespace

TEST_CASE("node stacks: each running worker's stacks and step, Python ones by their signal",
          "[unit][hangs]") {
  asio::io_context io;
  ScratchDir dir("node_stacks");
  GivenPids workers;
  // Local rank 0: a "Python" worker, appending its stacks to its file on the signal.
  const std::string stacks_file = dir.path("python_stacks");
  std::ofstream(stacks_file).close();
  const std::string script = "trap 'echo \"Thread 0x1 (most recent call first):\" >> " +
                             stacks_file + "; echo \"  File train.py, line 7 in step\" >> " +
                             stacks_file + "' " + std::to_string(NodeStacks::signal()) +
                             "; echo ready > " + dir.path("ready") +
                             "; while :; do sleep 0.05; done";
  ChildProcess python({"/bin/sh", "-c", script}, dir.path("python.log"));
  REQUIRE(wait_for_file(dir.path("ready"), 5s));
  workers.given[0] = python.pid();
  // Local rank 1: found hung by the watchdog, which took its stacks already (no eu-stack here).
  workers.given[1] = 4'999'999;
  // Local rank 2: not running.
  NodeStacks::Hooks hooks;
  std::vector<std::string> lines;
  hooks.log = [&lines](const std::string& l) { lines.push_back(l); };
  hooks.step = [](int local_rank) -> std::optional<std::int64_t> {
    if (local_rank == 0) return 17;
    return std::nullopt;
  };
  hooks.hung_stacks = [](int pid) -> std::optional<std::string> {
    if (pid != 4'999'999) return std::nullopt;
    return std::string("PID 4999999 - process\nTID 4999999:\n#0  0x1 futex_wait\n#1  0x2 main\n");
  };
  hooks.worker_dir = [&dir](int local_rank) { return dir.path(std::to_string(local_rank)); };
  NodeStacks stacks(io, workers, /*flight_recorder=*/false, dir.path(), std::move(hooks));
  stacks.reset(3);
  stacks.set_stacks_file(0, stacks_file);
  rdzv::RoundAssignment round;
  round.group_rank = 1;
  round.group_world_size = 2;
  round.rank_offset = 3;

  const rdzv::Json answer = take(io, stacks, round);
  CHECK(answer["node"] == 1);
  CHECK(answer["nodes"] == 2);
  CHECK(answer["flight"].empty());
  REQUIRE(answer["ranks"].size() == 2);  // local rank 2 runs no worker
  const rdzv::Json& py = answer["ranks"][0];
  CHECK(py["rank"] == 3);
  CHECK(py["pid"] == python.pid());
  CHECK(py["step"] == 17);
  CHECK(py["hung"] == false);
  CHECK(py["python_stacks"].get<std::string>().find("line 7 in step") != std::string::npos);
  const rdzv::Json& hung = answer["ranks"][1];
  CHECK(hung["rank"] == 4);
  CHECK(hung["hung"] == true);
  CHECK(hung["step"].is_null());
  CHECK(hung["native_stacks"].get<std::string>().find("futex_wait") != std::string::npos);
  python.signal(SIGKILL);
  python.wait(5s);
}

TEST_CASE("node stacks: a Flight Recorder's place is in the worker's directory", "[unit][hangs]") {
  CHECK(NodeStacks::flight_recorder_prefix("/logs/job/attempt_0/1") ==
        "/logs/job/attempt_0/1/nccl_trace_");
  CHECK(NodeStacks::signal() == SIGRTMIN + 6);
}
