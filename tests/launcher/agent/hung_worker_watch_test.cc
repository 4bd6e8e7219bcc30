// HungWorkerWatch (hung_worker_watch.h) alone, on fakes: workers in memory (fake_workers.h) and
// heartbeat files the test writes. HeartbeatMonitor's judgement is heartbeat_monitor_test's;
// these check what the watch does with a silent worker: the agent told, the stacks written to
// the worker's stderr, SIGABRT for a Python worker, SIGKILL for one that does not die of it.
#include "launcher/agent/hung_worker_watch.h"

#include <boost/asio.hpp>

#include <csignal>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "catch.h"
#include "fake_workers.h"
#include "process.h"

using namespace ctrun::launcher;
using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

// Two workers with heartbeat files; local rank 0 beats every 40 ms throughout, local rank 1
// beats until `silent` says stop. Watched with a 0.3 s timeout.
struct WatchBench {
  asio::io_context io;
  std::shared_ptr<WorkerScript> script = std::make_shared<WorkerScript>();
  FakeWorkers workers{io, script};
  ScratchDir dir{"hung_worker_watch"};
  HeartbeatFiles files;
  std::vector<std::pair<int, std::string>> found;  // (local rank, why)
  std::vector<std::string> lines;
  bool python = false;
  bool silent = false;
  bool beat_zero = true;
  std::unique_ptr<HungWorkerWatch> watch;
  asio::steady_timer beats{io};
  int step = 0;

  explicit WatchBench(double timeout = 0.3) {
    HungWorkerWatch::Settings settings;
    settings.timeout = timeout;
    settings.native_stacks_timeout = 2000ms;
    settings.python_stacks_timeout = 500ms;
    HungWorkerWatch::Hooks hooks;
    hooks.log = [this](const std::string& line) { lines.push_back(line); };
    hooks.watching = [] { return true; };
    hooks.who = [](int local_rank) { return "worker " + std::to_string(local_rank); };
    hooks.found = [this](int local_rank, int, const std::string& why) {
      found.emplace_back(local_rank, why);
    };
    hooks.reporting = [] { return false; };
    hooks.stderr_place = [](int) { return std::string("the console"); };
    hooks.python = [this] { return python; };
    watch = std::make_unique<HungWorkerWatch>(io, settings, workers, files, std::move(hooks));
  }

  void start() {
    files.reset(2);
    REQUIRE(files.create(0, dir.path("hb0")));
    REQUIRE(files.create(1, dir.path("hb1")));
    std::vector<WorkerSpec> specs(2);
    specs[1].local_rank = 1;
    REQUIRE(workers.start(std::move(specs), [](const WorkerExit&) {}));
    watch->workers_started();
    watch->start();
    beat();
  }

  void beat() {
    ++step;
    if (beat_zero) std::ofstream(dir.path("hb0"), std::ios::trunc) << step;
    if (!silent) std::ofstream(dir.path("hb1"), std::ios::trunc) << step;
    beats.expires_after(40ms);
    beats.async_wait([this](boost::system::error_code ec) {
      if (!ec) beat();
    });
  }

  template <typename Done>
  void run_until(Done done, std::chrono::milliseconds limit = 5000ms) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.restart();
      io.run_for(10ms);
    }
  }
};

}  // namespace

TEST_CASE("hung worker watch: a worker that stops beating is told, its stacks noted, SIGKILLed",
          "[unit][hangs]") {
  WatchBench bench;
  bench.start();
  bench.run_until([] { return false; }, 500ms);  // both beat: nothing is found
  CHECK(bench.found.empty());
  const int pid = bench.workers.running_pid(1);
  bench.silent = true;
  bench.run_until([&] { return !bench.script->killed.empty(); });
  REQUIRE(bench.found.size() == 1);
  CHECK(bench.found[0].first == 1);
  CHECK(bench.found[0].second.find("no heartbeat for") == 0);
  CHECK(bench.found[0].second.find("(--worker_timeout=0.3): killed as hung") != std::string::npos);
  REQUIRE(bench.script->killed.size() == 1);
  CHECK(bench.script->killed[0] == std::pair<int, int>(1, SIGKILL));  // a C++ worker: no SIGABRT
  REQUIRE(bench.script->notes.size() == 1);
  CHECK(bench.script->notes[0].first == 1);
  CHECK(bench.script->notes[0].second.find("ctrun: worker 1 hung: native stacks (eu-stack -p " +
                                           std::to_string(pid) + ")") == 0);
  CHECK(bench.watch->hung_stacks(pid).has_value());
  CHECK_FALSE(bench.watch->hung_stacks(bench.workers.running_pid(0)).has_value());
  // A new group: nothing found hung in it.
  bench.watch->workers_started();
  CHECK_FALSE(bench.watch->hung_stacks(pid).has_value());
}

TEST_CASE("hung worker watch: a hung Python worker gets SIGABRT for its stacks first",
          "[unit][hangs]") {
  WatchBench bench;
  bench.python = true;
  bench.start();
  bench.run_until([] { return false; }, 200ms);
  bench.silent = true;
  bench.run_until([&] { return !bench.script->killed.empty(); });
  // The fake worker dies of the SIGABRT, as faulthandler's does: no SIGKILL after it.
  bench.run_until([] { return false; }, 700ms);
  REQUIRE(bench.script->killed.size() == 1);
  CHECK(bench.script->killed[0] == std::pair<int, int>(1, SIGABRT));
  bool said = false;
  for (const auto& line : bench.lines) {
    said = said || line == "worker 1: sent SIGABRT: Python stacks (faulthandler) to the console";
  }
  CHECK(said);
}

TEST_CASE("hung worker watch: a worker that never beat, or without a timeout, is left alone",
          "[unit][hangs]") {
  SECTION("never beat (a program without the runtime)") {
    WatchBench bench;
    bench.silent = true;
    bench.start();
    bench.run_until([] { return false; }, 800ms);
    CHECK(bench.found.empty());
    CHECK(bench.script->killed.empty());
  }
  SECTION("no --worker_timeout") {
    WatchBench bench(0);
    bench.start();
    bench.silent = true;
    bench.beat_zero = false;
    bench.run_until([] { return false; }, 800ms);
    CHECK(bench.found.empty());
    CHECK(bench.script->killed.empty());
  }
}
