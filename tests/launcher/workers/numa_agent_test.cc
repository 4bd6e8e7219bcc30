// --numa-binding on this machine: each worker runs on the CPUs the agent planned for it (its
// log line), with its memory preferred from the planned node; a plan that cannot be met is a
// one-line error before any worker starts.
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <regex>

#include "catch.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// A worker that writes where it runs: its allowed CPUs and its memory policy.
std::string write_probe(const ScratchDir& s) {
  const std::string path = s.path("probe.sh");
  std::ofstream(path) << "#!/bin/sh\n"
                         "cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)\n"
                         "policy=$(head -n 1 /proc/self/numa_maps | cut -d' ' -f2)\n"
                         "echo \"$cpus $policy\" > " +
                             s.path("where.") + "$LOCAL_RANK\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

// "local rank R on CPUs X, memory from NUMA node N" from the agent's log.
std::map<int, std::pair<std::string, std::string>> planned(const std::string& log) {
  std::map<int, std::pair<std::string, std::string>> out;
  static const std::regex line(
      R"(local rank (\d+) on CPUs ([0-9,-]+), memory from NUMA node (\d+))");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    out[std::stoi((*it)[1])] = {(*it)[2], (*it)[3]};
  }
  return out;
}

}  // namespace

TEST_CASE("numa binding: workers run where the plan puts them, memory preferred from its node") {
  ScratchDir s("numa");
  const std::string probe = write_probe(s);
  for (const char* mode : {"node", "socket", "exclusive", "core-complex"}) {
    INFO(mode);
    ChildProcess agent({CTRUN_PATH, "--standalone", "--nproc_per_node=2",
                        std::string("--numa-binding=") + mode, probe},
                       s.path(std::string(mode) + ".log"));
    const auto code = agent.wait(30s);
    const std::string log = read_file(s.path(std::string(mode) + ".log"));
    INFO(log);
    REQUIRE(code.has_value());
    if (std::string(mode) == "exclusive" &&
        log.find("physical cores for 2 workers") != std::string::npos) {
      CHECK(*code == 1);  // a machine of one core: refused, in one line, before any worker
      continue;
    }
    REQUIRE(*code == 0);
    const auto plan = planned(log);
    REQUIRE(plan.size() == 2);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string where = read_file(s.path("where." + std::to_string(rank)));
      CHECK(where == plan.at(rank).first + " prefer:" + plan.at(rank).second + "\n");
    }
    if (std::string(mode) == "exclusive") CHECK(plan.at(0).first != plan.at(1).first);
  }
}

TEST_CASE("numa binding: the plan keeps within the agent's own CPU affinity") {
  ScratchDir s("numa");
  const std::string probe = write_probe(s);
  ChildProcess agent({"/usr/bin/taskset", "-c", "0", CTRUN_PATH, "--standalone",
                      "--nproc_per_node=1", "--numa-binding=node", probe},
                     s.path("agent.log"));
  const auto code = agent.wait(30s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code == std::optional<int>(0));
  CHECK(read_file(s.path("where.0")).rfind("0 prefer:", 0) == 0);
}
