// ctrun --slurm under a real Slurm: a private single-node cluster on localhost
// (scripts/slurm-local.sh: munged, slurmctld, slurmd) and `srun ctrun --slurm mlp`. Without its
// prerequisites (no Slurm installed, not root) the test is skipped and says why; with them, a
// cluster that does not start is a failure (CI installs them: a broken script must not hide).
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "catch.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// The cluster of one test, stopped (by the PIDs the script recorded) whatever happens.
class LocalSlurm {
 public:
  explicit LocalSlurm(const ScratchDir& dir) : dir_(dir.path("slurm")) {
    std::filesystem::create_directories(dir_);
    ChildProcess start({SLURM_LOCAL_PATH, "start", dir_}, dir.path("slurm-start.log"));
    auto rc = start.wait(90s);
    started_ = rc && *rc == 0;
    log_ = read_file(dir.path("slurm-start.log"));
  }
  ~LocalSlurm() {
    ChildProcess stop({SLURM_LOCAL_PATH, "stop", dir_}, dir_ + "/../slurm-stop.log");
    (void)stop.wait(60s);
  }
  bool started() const { return started_; }
  const std::string& log() const { return log_; }
  std::string conf() const { return dir_ + "/slurm.conf"; }

 private:
  std::string dir_;
  bool started_ = false;
  std::string log_;
};

bool installed(const char* path) { return access(path, X_OK) == 0; }

}  // namespace

TEST_CASE("slurm: srun ctrun --slurm trains mlp with the node, rank and run id Slurm gives") {
  if (geteuid() != 0 || !installed("/usr/sbin/slurmctld") || !installed("/usr/sbin/slurmd") ||
      !installed("/usr/sbin/munged") || !installed("/usr/bin/srun")) {
    CTRUN_SKIP(
        "needs root and Debian's slurmctld, slurmd, munge and slurm-client "
        "(scripts/setup.sh installs them)");
  }
  ScratchDir s("slurm");
  LocalSlurm slurm(s);
  INFO("scripts/slurm-local.sh start:\n" + slurm.log());
  REQUIRE(slurm.started());
  // One ctrun per node, as Slurm users launch it; ctrun starts the two workers itself.
  ChildProcess job({"/usr/bin/env", "SLURM_CONF=" + slurm.conf(), "/usr/bin/srun", "-N1", "-n1",
                    "--ntasks-per-node=1", CTRUN_PATH, "--slurm", "--nproc_per_node=2",
                    "--event_log=" + s.path("events.jsonl"), MLP_PATH, "--epochs", "1", "--samples",
                    "512", "--seed", "3"},
                   s.path("job.log"));
  auto rc = job.wait(180s);
  const std::string log = read_file(s.path("job.log"));
  INFO(log);
  REQUIRE(rc.has_value());
  CHECK(*rc == 0);
  CHECK(log.find("round 0: group rank 0 of 1, ranks 0..1 of world size 2") != std::string::npos);
  CHECK(log.find("final loss") != std::string::npos);

  // The run id is the Slurm job id; the rendezvous was hosted on node 0 at the derived port.
  std::istringstream lines(read_file(s.path("events.jsonl")));
  std::string job_id;
  std::string rendezvous;
  for (std::string line; std::getline(lines, line);) {
    const auto e = nlohmann::json::parse(line);
    if (e.at("event") == "agent_start") {
      job_id = e.at("job");
      rendezvous = e.at("rendezvous");
    }
  }
  REQUIRE_FALSE(job_id.empty());
  CHECK(job_id.find_first_not_of("0123456789") == std::string::npos);
  int port = 29400 + std::stoi(job_id) % 10000;
  if (port == 29500) port = 39500;  // torch's default port is left alone
  // (std::string(":"): g++ 12 at -O3 warns falsely on `":" + std::string&&`, GCC bug 105651.)
  CHECK(rendezvous.find(std::string(":") + std::to_string(port)) != std::string::npos);
  CHECK(log.find("hosting the rendezvous") != std::string::npos);
}
