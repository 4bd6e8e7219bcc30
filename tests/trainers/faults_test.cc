// ctrun --faults end to end on the C++ trainer: a random plan of kills, signals and hangs,
// restarts from checkpoints, and the result the fault report quotes is the clean run's,
// bit for bit; and with --fault_tolerance=step, workers replaced alone and no step lost.
#include <regex>
#include <set>

#include "catch.h"
#include "ctrun/rendezvous/json.h"
#include "ft_checks.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
using Json = ctrun::rendezvous::Json;

namespace {

std::vector<std::string> mlp_job(const ScratchDir& s, const std::string& name,
                                 std::vector<std::string> faults) {
  std::vector<std::string> argv = {CTRUN_PATH, "--standalone", "--nproc_per_node=3",
                                   "--max_restarts=6"};
  argv.insert(argv.end(), faults.begin(), faults.end());
  argv.insert(argv.end(), {MLP_PATH, "--epochs", "3", "--samples", "6144", "--seed", "3",
                           "--checkpoint_dir", s.path(name + ".ckpt"), "--checkpoint_every", "8"});
  return argv;
}

}  // namespace

TEST_CASE("faults: mlp under a random plan of five faults ends with the clean run's digest") {
  ScratchDir s("faults_e2e");
  ChildProcess clean(mlp_job(s, "clean", {}), s.path("clean.log"));
  REQUIRE(clean.wait(180s) == 0);
  std::smatch m;
  const std::string clean_log = read_file(s.path("clean.log"));
  REQUIRE(std::regex_search(clean_log, m, std::regex("digest ([0-9a-f]{16})")));
  const std::string clean_digest = m[1];

  // Kills, a SIGTERM, a SIGSEGV and hangs at steps drawn from the seed; each kill restarts
  // the job from its last checkpoint (every 8 steps).
  ChildProcess faulted(
      mlp_job(s, "faulted",
              {"--faults",
               "random:seed=5,count=5,kinds=kill+term+segv+hang,ranks=0-2,steps=5-90,duration=1",
               "--fault_report", s.path("report.json")}),
      s.path("faulted.log"));
  const auto rc = faulted.wait(300s);
  const std::string log = read_file(s.path("faulted.log"));
  INFO(log);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(count_of(log, "ctrun: injecting fault ") == 5);
  const Json report = Json::parse(read_file(s.path("report.json")));
  CHECK(report["outcome"] == "succeeded");
  CHECK(report["faults"].size() == 5);
  CHECK(report["restarts"].get<int>() >= 1);
  REQUIRE(report["results"].size() == 3);
  for (const auto& [rank, digest] : report["results"].items()) {
    INFO("rank " << rank);
    CHECK(digest == clean_digest);
  }
  // Every fault that killed its worker was seen, and the job ran again after it.
  for (const Json& f : report["faults"]) {
    if (f.contains("worker_exit")) CHECK(f.contains("running_again"));
  }
}

TEST_CASE("faults: mlp --fault_tolerant under a random plan of five faults loses no step") {
  ScratchDir s("faults_ft");
  // Kills, SIGTERMs, exceptions and one-second hangs at steps drawn from the seed; each worker
  // that ends is replaced alone, heals from a peer and trains on.
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
  const auto mlp = ft_mlp_argv(MLP_PATH, 12288, s.path("consumed"));
  argv.insert(argv.end(), mlp.begin(), mlp.end());
  ChildProcess job(argv, s.path("job.log"));
  const auto rc = job.wait(300s);
  const std::string log = read_file(s.path("job.log"));
  INFO(without_step_lines(log));
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(count_of(log, "ctrun: injecting fault ") == 5);
  CHECK(log.find("replacing worker rank ") != std::string::npos);
  CHECK(log.find("restarting the job") == std::string::npos);  // nobody else stopped
  CHECK(check_fault_tolerant_report(s.path("report.json")) == 3);
  check_commits(read_consumed(s.path("consumed")), 12288);
}

// docs/faults.md's ctest recipe (docs/examples/faults_check.cmake) run as a user's
// CMakeLists.txt runs it, on mlp: it passes where the job survives its plan, and fails, saying
// why, where the job dies of it.
TEST_CASE("faults: the ctest recipe of docs/faults.md passes on mlp, and fails a job that dies") {
  ScratchDir s("faults_recipe_ctest");
  auto recipe = [&](const std::string& name, const std::string& faults,
                    const std::string& max_restarts) {
    const std::string dir = s.path(name);
    return std::vector<std::string>{
        CMAKE_PATH,
        "-DCTRUN=" CTRUN_PATH,
        "-DTRAINER=" MLP_PATH,
        "-DTRAINER_ARGS=--epochs;2;--samples;4096;--seed;3;--checkpoint_every;8;--checkpoint_dir;" +
            dir + "/@RUN@.ckpt",
        "-DFAULTS=" + faults,
        "-DWORK_DIR=" + dir,
        "-DMAX_RESTARTS=" + max_restarts,
        "-P",
        FAULTS_CHECK_PATH};
  };
  // 2 ranks, 64 steps: a kill, a SIGTERM and a hang among the first 50.
  ChildProcess passing(
      recipe("pass", "random:seed=5,count=3,kinds=kill+term+hang,ranks=0-1,steps=5-50,duration=1",
             "10"),
      s.path("pass.log"));
  const auto passed = passing.wait(300s);
  std::string out = read_file(s.path("pass.log"));
  INFO(out);
  CHECK(passed == std::optional<int>(0));
  CHECK(out.find("faults_check: 3 faults, and the results of all 2 ranks are the clean run's") !=
        std::string::npos);

  // No restart left for a killed worker: the faulted run fails, and so does the test.
  ChildProcess failing(recipe("fail", "kill:rank=1,at_step=10", "0"), s.path("fail.log"));
  const auto failed = failing.wait(300s);
  out = read_file(s.path("fail.log"));
  INFO(out);
  REQUIRE(failed);
  CHECK(*failed != 0);
  CHECK(out.find("faults_check: the faulted run failed (1)") != std::string::npos);
  CHECK(read_file(s.path("fail/faulted.log"))
            .find("injecting fault 1: SIGKILL to rank 1 at step 10") != std::string::npos);
}
