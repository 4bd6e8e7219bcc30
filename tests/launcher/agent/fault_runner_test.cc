// FaultRunner (fault_runner.h) alone, on fakes: workers in memory (fake_workers.h), the job's
// store on the memory etcd, steps from the test. The plan's decisions are the injector's
// (fault_injector_test); these check that the runner carries them out on the workers, records
// them in the job's store, takes faults asked for by `ctrun fault`, and writes the report.
#include "launcher/agent/fault_runner.h"

#include <boost/asio.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "catch.h"
#include "fake_workers.h"
#include "launcher/faults/fault_plan.h"
#include "memory_etcd.h"
#include "process.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/protocol/fault_keys.h"

using namespace ctrun::launcher;
using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// One node of one job (2 local workers, global ranks 2 and 3) with the runner on the fakes.
struct RunnerBench {
  asio::io_context io;
  std::shared_ptr<MemoryEtcd> etcd = MemoryEtcd::create(io);
  std::shared_ptr<WorkerScript> script = std::make_shared<WorkerScript>();
  FakeWorkers workers{io, script};
  ScratchDir dir{"fault_runner"};
  LaunchOptions options;
  std::map<int, std::int64_t> steps;  // by local rank: what the workers "reported"
  std::vector<std::string> lines;
  std::vector<std::string> events;
  bool exiting = false;
  std::unique_ptr<rdzv::Backend> backend;
  std::unique_ptr<FaultRunner> runner;
  rdzv::RoundAssignment round;

  rdzv::Result<std::unique_ptr<FaultRunner>> create(const std::string& faults) {
    options.faults = faults;
    FaultRunner::Hooks hooks;
    hooks.log = [this](const std::string& line) { lines.push_back(line); };
    hooks.event = [this](const std::string& name, rdzv::Json) { events.push_back(name); };
    hooks.step = [this](int local_rank) -> std::optional<std::int64_t> {
      auto it = steps.find(local_rank);
      if (it == steps.end()) return std::nullopt;
      return it->second;
    };
    hooks.worker_dir = [this](int local_rank) {
      return dir.path() + "/" + std::to_string(local_rank);
    };
    hooks.stop_rendezvous = [] { return false; };
    hooks.start_rendezvous = [] { return rdzv::ok_status(); };
    hooks.exiting = [this] { return exiting; };
    return FaultRunner::create(io, options, "node-a", workers, std::move(hooks));
  }

  // The runner made and connected, and its node's two workers started in round 1.
  void start(const std::string& faults) {
    auto made = create(faults);
    REQUIRE(made.ok());
    runner = std::move(made).value();
    rdzv::BackendSpec spec;
    spec.service = rdzv::BackendSpec::Service::kEtcd;
    spec.endpoints = {rdzv::Endpoint{"127.0.0.1", 2379}};
    spec.job = "faults";
    spec.connect_kv = [this](const rdzv::etcd::ClientOptions& o) { return etcd->connect(o); };
    backend = runner->wrap_backend(rdzv::make_backend(io, std::move(spec)));
    std::optional<rdzv::Status> connected;
    asio::co_spawn(io, backend->connect(),
                   [&connected](std::exception_ptr, rdzv::Status s) { connected = s; });
    run_until([&] { return connected.has_value(); });
    REQUIRE(connected.has_value());
    REQUIRE(connected->ok());
    runner->connected("127.0.0.9");
    round.round = 1;
    round.group_rank = 1;
    round.rank_offset = 2;
    round.world_size = 4;
    round.store_prefix = "/round/1/";
    std::vector<WorkerSpec> specs(2);
    specs[1].local_rank = 1;
    REQUIRE(
        workers.start(std::move(specs), [this](const WorkerExit& e) { runner->worker_ended(e); }));
    runner->workers_started(round, 2, 0, false);
  }

  // Runs the loop until `done` holds (at most 5 s).
  template <typename Done>
  void run_until(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.restart();
      io.run_for(10ms);
    }
  }

  // The job's store's value of `key`, or "" when it is not set within 3 s.
  std::string stored(const std::string& key) {
    std::optional<rdzv::Result<std::string>> got;
    asio::co_spawn(io, backend->get(key, 3000ms),
                   [&got](std::exception_ptr, rdzv::Result<std::string> r) { got = std::move(r); });
    run_until([&] { return got.has_value(); });
    if (got && !got->ok()) UNSCOPED_INFO("get " << key << ": " << got->error().message);
    return got && got->ok() ? got->value() : "";
  }

  bool logged(const std::string& text) const {
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

}  // namespace

TEST_CASE(
    "fault runner: a kill planned at a step lands when the worker reports it, and is recorded",
    "[unit][faults]") {
  RunnerBench bench;
  bench.options.fault_report = bench.dir.path() + "/report.json";
  bench.start("kill:rank=3,at_step=5");
  CHECK(bench.logged("fault plan (replay it"));
  std::filesystem::create_directories(bench.dir.path() + "/0");
  bench.runner->set_result_file(0, bench.dir.path() + "/0/result");
  std::ofstream(bench.dir.path() + "/0/result") << "loss=0.25\n";

  bench.steps[1] = 4;
  bench.io.restart();  // a step short: nothing may fire
  bench.io.run_for(100ms);
  CHECK(bench.script->killed.empty());
  CHECK(bench.workers.running() == 2);

  bench.steps[1] = 5;
  bench.run_until([&] { return !bench.script->killed.empty(); });
  REQUIRE(bench.script->killed.size() == 1);
  CHECK(bench.script->killed[0] == std::pair<int, int>(1, SIGKILL));  // rank 3 = local rank 1
  CHECK(bench.logged("injecting fault 1"));

  const std::string record = bench.stored(std::string(rdzv::kFaultInjectedPrefix) + "1");
  REQUIRE_FALSE(record.empty());
  const rdzv::Json json = rdzv::Json::parse(record);
  CHECK(json["node"] == "node-a");
  CHECK(json["host"] == "127.0.0.9");
  CHECK(json["rank"] == 3);
  CHECK(json["injected"] == true);
  // Where this node is, for a peer's lost link.
  CHECK(bench.stored("/round/1/" + std::string(rdzv::kFaultHostKey) + "1") == "127.0.0.9");

  bench.runner->workers_stopping();
  bench.runner->finish(1, 2);
  std::ifstream in(bench.options.fault_report);
  REQUIRE(in);
  const rdzv::Json report = rdzv::Json::parse(in);
  CHECK(report["results"]["2"] == "loss=0.25");
  REQUIRE(report["faults"].is_array());
  REQUIRE(report["faults"].size() == 1);
  CHECK(report["faults"][0]["step_at_fault"] == 5);
}

TEST_CASE("fault runner: a hung worker is continued when its group is stopped", "[unit][faults]") {
  RunnerBench bench;
  bench.start("hang:rank=2,after=0");
  bench.run_until([&] { return !bench.script->killed.empty(); });
  REQUIRE(bench.script->killed.size() == 1);
  CHECK(bench.script->killed[0] == std::pair<int, int>(0, SIGSTOP));
  bench.runner->workers_stopping();  // the agent stops the group: SIGCONT, to see the signal
  REQUIRE(bench.script->killed.size() == 2);
  CHECK(bench.script->killed[1] == std::pair<int, int>(0, SIGCONT));
}

TEST_CASE("fault runner: a planned exception is written to the worker's fault file",
          "[unit][faults]") {
  RunnerBench bench;
  std::filesystem::create_directories(bench.dir.path() + "/1");
  bench.start("exception:rank=3,after=0");
  const std::string file = bench.dir.path() + "/1/fault";
  bench.run_until([&] { return std::filesystem::exists(file); });
  std::ifstream in(file);
  std::string kind, message;
  std::getline(in, kind);
  std::getline(in, message);
  CHECK(kind == "exception");
  CHECK(message.find("ctrun: injected fault 1") == 0);
  CHECK(bench.script->killed.empty());  // the worker raises it itself
}

TEST_CASE("fault runner: a fault asked for by ctrun fault fires, a bad one is said and ignored",
          "[unit][faults]") {
  RunnerBench bench;
  bench.start("live");
  // What `ctrun fault` writes: a count, then the request under its number.
  auto ask = [&bench](int number, const std::string& text) {
    bool done = false;
    asio::co_spawn(
        bench.io,
        [&bench, number, text]() -> rdzv::Task<void> {
          (void)co_await bench.backend->add(rdzv::kFaultRequestsKey, 1);
          (void)co_await bench.backend->set(
              std::string(rdzv::kFaultRequestPrefix) + std::to_string(number), text);
        },
        [&done](std::exception_ptr) { done = true; });
    bench.run_until([&done] { return done; });
  };
  bench.io.restart();
  bench.io.run_for(200ms);  // the watch reads the count it starts from
  ask(1, "{\"kind\": \"explode\"}");
  bench.run_until([&] { return bench.logged("ctrun fault 1 ignored"); });
  CHECK(bench.logged("ctrun fault 1 ignored"));
  auto request = parse_fault_request("term:rank=2");  // as `ctrun fault term:rank=2` asks
  REQUIRE(request.ok());
  ask(2, request.value().dump());
  bench.run_until([&] { return !bench.script->killed.empty(); });
  REQUIRE(bench.script->killed.size() == 1);
  CHECK(bench.script->killed[0] == std::pair<int, int>(0, SIGTERM));
  CHECK(bench.logged("fault asked for (ctrun fault 2)"));
  // Its record names the request, for `ctrun fault` waiting on it.
  const std::string done =
      bench.stored(std::string(rdzv::kFaultRequestPrefix) + "2" + rdzv::kFaultRequestDoneSuffix);
  REQUIRE_FALSE(done.empty());
  CHECK(rdzv::Json::parse(done)["request"] == 2);
  bench.exiting = true;
}

TEST_CASE("fault runner: a plan this node cannot carry out is refused at setup", "[unit][faults]") {
  RunnerBench bench;
  auto bad = bench.create("kill:rank=1");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("--faults: fault 1: says not when") == 0);
  bench.options.rdzv_backend = "etcd";
  auto restart = bench.create("rendezvous_restart:after=1,duration=1");
  REQUIRE_FALSE(restart.ok());
  CHECK(restart.error().message.find("--faults: fault 1: a rendezvous restart") == 0);
}
