// torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters under the real ctrun: each
// attempt's filtered_stdout.log and filtered_stderr.log hold exactly the workers' console lines
// that contain a filter, with their "[default<rank>]:" prefix.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A shell-script worker (run with --no-python) with the given body.
std::string write_worker(const ScratchDir& s, const std::string& name, const std::string& body) {
  const std::string path = s.path(name);
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

// The lines of a file, sorted: ranks write to the shared file in no fixed order.
std::vector<std::string> sorted_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// LOG_DIR/RUN_ID: the only run under the log dir (--standalone picks a random run id).
fs::path only_run(const std::string& log_dir) {
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(log_dir)) runs.push_back(entry.path());
  REQUIRE(runs.size() == 1);
  return runs[0];
}

}  // namespace

TEST_CASE(
    "duplicate filters: filtered_stdout.log and filtered_stderr.log hold the matching lines") {
  ScratchDir s("dup_filters");
  const std::string worker =
      write_worker(s, "fruit.sh",
                   "echo \"apple pie from $LOCAL_RANK\"\n"
                   "echo \"banana from $LOCAL_RANK\"\n"
                   "echo \"orange juice from $LOCAL_RANK\"\n"
                   "echo \"pear on stderr from $LOCAL_RANK\" >&2\n"
                   "echo \"apple on stderr from $LOCAL_RANK\" >&2\n"
                   "printf 'last apple from %s' \"$LOCAL_RANK\"\n");  // no newline at the end
  // The stderr filter comes from its PET_ variable, as torchrun reads it.
  ChildProcess agent({"/usr/bin/env", "PET_DUPLICATE_STDERR_FILTERS=pear", CTRUN_PATH,
                      "--standalone", "--nproc_per_node=2", "--log_dir", s.path("logs"), "--tee",
                      "3", "--duplicate_stdout_filters", "apple,orange", "--no-python", worker},
                     s.path("agent.log"));
  const auto code = agent.wait(60s);
  const std::string console = read_file(s.path("agent.log"));
  INFO(console);
  REQUIRE(code.has_value());
  REQUIRE(*code == 0);
  const fs::path attempt = only_run(s.path("logs")) / "attempt_0";
  CHECK(sorted_lines(attempt / "filtered_stdout.log") == std::vector<std::string>{
                                                             "[default0]:apple pie from 0",
                                                             "[default0]:last apple from 0",
                                                             "[default0]:orange juice from 0",
                                                             "[default1]:apple pie from 1",
                                                             "[default1]:last apple from 1",
                                                             "[default1]:orange juice from 1",
                                                         });
  CHECK(sorted_lines(attempt / "filtered_stderr.log") ==
        std::vector<std::string>{"[default0]:pear on stderr from 0",
                                 "[default1]:pear on stderr from 1"});
  // Non-matching lines reached the console and the rank's own log, not the copies.
  CHECK(console.find("[default0]:banana from 0") != std::string::npos);
  CHECK(read_file(attempt / "0" / "stdout.log").find("banana from 0") != std::string::npos);
  CHECK(read_file(attempt / "filtered_stdout.log").find("banana") == std::string::npos);
  CHECK(read_file(attempt / "filtered_stderr.log").find("apple") == std::string::npos);
}

TEST_CASE("duplicate filters: a restart writes its own attempt's filtered file") {
  ScratchDir s("dup_filters");
  // Local rank 0 fails in the first attempt, a second after both ranks printed their line.
  const std::string worker =
      write_worker(s, "fail_once.sh",
                   "echo \"apple from $LOCAL_RANK in attempt $TORCHELASTIC_RESTART_COUNT\"\n"
                   "echo \"banana\"\n"
                   "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$LOCAL_RANK\" = 0 ]; then\n"
                   "  sleep 1\n"
                   "  exit 3\n"
                   "fi\n");
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=2", "--max-restarts", "1", "--log_dir",
       s.path("logs"), "--tee", "3", "--duplicate_stdout_filters", "apple", "--no-python", worker},
      s.path("agent.log"));
  const auto code = agent.wait(60s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(code.has_value());
  REQUIRE(*code == 0);
  const fs::path run = only_run(s.path("logs"));
  CHECK(sorted_lines(run / "attempt_0" / "filtered_stdout.log") ==
        std::vector<std::string>{"[default0]:apple from 0 in attempt 0",
                                 "[default1]:apple from 1 in attempt 0"});
  CHECK(sorted_lines(run / "attempt_1" / "filtered_stdout.log") ==
        std::vector<std::string>{"[default0]:apple from 0 in attempt 1",
                                 "[default1]:apple from 1 in attempt 1"});
  // No --duplicate_stderr_filters: no stderr copy.
  CHECK_FALSE(fs::exists(run / "attempt_0" / "filtered_stderr.log"));
  CHECK_FALSE(fs::exists(run / "attempt_1" / "filtered_stderr.log"));
}

TEST_CASE("duplicate filters: a filtered file that cannot be opened fails the start naming it") {
  ScratchDir s("dup_filters");
  const std::string worker = write_worker(s, "never.sh", "touch \"$0.ran\"\n");
  // A directory where the file should be: open() fails whoever runs the test.
  const std::string blocked = s.path("logs/blocked/attempt_0/filtered_stderr.log");
  fs::create_directories(blocked);
  ChildProcess agent({CTRUN_PATH, "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0",
                      "--rdzv_id=blocked", "--nproc_per_node=2", "--log_dir", s.path("logs"),
                      "--duplicate_stderr_filters", "pear", "--no-python", worker},
                     s.path("agent.log"));
  const auto code = agent.wait(60s);
  const std::string console = read_file(s.path("agent.log"));
  INFO(console);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(console.find("cannot open log file '" + blocked + "'") != std::string::npos);
  CHECK_FALSE(fs::exists(worker + ".ran"));  // no worker started
}
