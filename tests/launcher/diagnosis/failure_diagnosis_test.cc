// Failures that explain themselves: real agents and real workers (Python scripts without torch's
// @record, a hung Python worker, a hung C++ worker), the root-cause report and the logs read
// back. Every wait is bounded; every process is stopped and reaped when a test ends.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "catch.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct Scratch : ScratchDir {
  Scratch() : ScratchDir("diagnosis") {}
};

std::vector<std::string> ctrun_args(std::vector<std::string> args) {
  args.insert(args.begin(), CTRUN_PATH);
  return args;
}

// The root-cause report: from torchrun's "Root Cause" header to the closing rule.
std::string report_in(const std::string& log) {
  const auto start = log.find("Root Cause (first observed failure):");
  if (start == std::string::npos) return "";
  const auto end = log.find(std::string(60, '='), start);
  return log.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The one stderr.log of local rank `local_rank` under LOG_DIR/RUN_ID/attempt_0/.
std::string stderr_log(const std::string& log_dir, int local_rank) {
  for (const auto& run : fs::directory_iterator(log_dir)) {
    return (run.path() / "attempt_0" / std::to_string(local_rank) / "stderr.log").string();
  }
  return "";
}

bool have_eu_stack() {
  for (const char* dir : {"/usr/bin/", "/usr/local/bin/", "/bin/"}) {
    if (::access((std::string(dir) + "eu-stack").c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("diagnosis: a Python exception without @record is in the report, with its log") {
  Scratch s;
  SystemPython python;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=1", "--log_dir", s.path("logs"),
                                 RAISE_SCRIPT_PATH}),
                     s.path("agent.log"));
  REQUIRE(agent.wait(60s) == std::optional<int>(1));
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  const std::string report = report_in(log);
  REQUIRE_FALSE(report.empty());
  CHECK(report.find("error_file: <N/A>") != std::string::npos);  // no @record: no error file
  // ... yet the traceback is there, from the worker's stderr, and where the full log is.
  CHECK(report.find("the end of its stderr:\n              Traceback (most recent call last):") !=
        std::string::npos);
  CHECK(report.find("in load_batch") != std::string::npos);
  CHECK(report.find("              ValueError: bad batch at step 7 on rank 0\n") !=
        std::string::npos);
  CHECK(report.find("a warning on stderr") == std::string::npos);  // the traceback, not more
  const std::string path = stderr_log(s.path("logs"), 0);
  CHECK(report.find("  stderr    : " + path + "\n") != std::string::npos);
  CHECK(read_file(path).find("ValueError: bad batch at step 7") != std::string::npos);

  // Without log files the report still quotes the console's stderr, and names no file.
  ChildProcess console(ctrun_args({"--standalone", "--nproc_per_node=1", RAISE_SCRIPT_PATH}),
                       s.path("console.log"));
  REQUIRE(console.wait(60s) == std::optional<int>(1));
  const std::string plain = report_in(read_file(s.path("console.log")));
  INFO(plain);
  CHECK(plain.find("ValueError: bad batch at step 7 on rank 0") != std::string::npos);
  CHECK(plain.find("stderr    :") == std::string::npos);
}

TEST_CASE("diagnosis: a hung Python worker's threads are in its log and the report") {
  Scratch s;
  SystemPython python;
  const auto started = std::chrono::steady_clock::now();
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=1", "--worker_timeout=1",
                                 "--log_dir", s.path("logs"), HANG_SCRIPT_PATH}),
                     s.path("agent.log"));
  REQUIRE(agent.wait(60s) == std::optional<int>(1));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(log.find("(local rank 0): no heartbeat for ") != std::string::npos);
  CHECK(log.find("killed as hung") != std::string::npos);
  CHECK(log.find("sent SIGABRT: Python stacks (faulthandler)") != std::string::npos);
  const std::string report = report_in(log);
  REQUIRE_FALSE(report.empty());
  CHECK(report.find("signal    : 6 (SIGABRT)") != std::string::npos);
  CHECK(report.find("traceback : no heartbeat for ") != std::string::npos);  // the agent's file
  CHECK(report.find("  stderr_end: the last lines of its stderr:\n"
                    "              Fatal Python error: Aborted") != std::string::npos);
  // Both threads: the helper's sleep and the main thread's wait, each in its function.
  CHECK(report.find("hread 0x") != std::string::npos);
  CHECK(report.find("(most recent call first):") != std::string::npos);
  CHECK(report.find("in sleeper_thread_body") != std::string::npos);
  CHECK(report.find("in main_thread_blocked") != std::string::npos);
  // The worker's log has all of it, the native stacks before the Python ones.
  const std::string worker_log = read_file(stderr_log(s.path("logs"), 0));
  INFO(worker_log);
  const auto native = worker_log.find("hung: native stacks (eu-stack -p ");
  const auto python_stacks = worker_log.find("Fatal Python error: Aborted");
  REQUIRE(native != std::string::npos);
  REQUIRE(python_stacks != std::string::npos);
  CHECK(native < python_stacks);
  CHECK(worker_log.find("in sleeper_thread_body") != std::string::npos);
  if (have_eu_stack()) {
    CHECK(report.find("  native    : stacks before the kill (eu-stack -p ") != std::string::npos);
    CHECK(report.find("TID ") != std::string::npos);
  }
  CHECK(took < 30);
}

TEST_CASE("diagnosis: a hung C++ worker's native stacks are in its log and the report") {
  Scratch s;
  ChildProcess agent(ctrun_args({"--standalone", "--nproc_per_node=1", "--worker_timeout=1",
                                 "--log_dir", s.path("logs"), TEST_WORKER_PATH, "hang"}),
                     s.path("agent.log"));
  REQUIRE(agent.wait(60s) == std::optional<int>(1));
  const std::string log = read_file(s.path("agent.log"));
  INFO(log);
  CHECK(log.find("killed as hung") != std::string::npos);
  CHECK(log.find("was killed by SIGKILL") != std::string::npos);  // not a Python worker: no SIGABRT
  CHECK(log.find("SIGABRT") == std::string::npos);
  const std::string report = report_in(log);
  REQUIRE_FALSE(report.empty());
  const std::string worker_log = read_file(stderr_log(s.path("logs"), 0));
  INFO(worker_log);
  CHECK(worker_log.find("ctrun: worker rank 0 (local rank 0) hung: native stacks (eu-stack -p ") !=
        std::string::npos);
  if (!have_eu_stack()) {
    CHECK(worker_log.find("eu-stack (elfutils) not found") != std::string::npos);
    CHECK(report.find("eu-stack (elfutils) not found") != std::string::npos);
    WARN("eu-stack is not installed: only its absence was checked");
    return;
  }
  if (worker_log.find("Operation not permitted") != std::string::npos) {
    // No ptrace here (a container without CAP_SYS_PTRACE): the refusal is explained instead.
    CHECK(worker_log.find("was not allowed to attach") != std::string::npos);
    CHECK(report.find("was not allowed to attach") != std::string::npos);
    WARN("eu-stack may not attach on this machine: only the explanation was checked");
    return;
  }
  CHECK(log.find("native stacks (eu-stack) written to " + stderr_log(s.path("logs"), 0)) !=
        std::string::npos);
  for (const std::string& text : {worker_log, report}) {
    CHECK(text.find("TID ") != std::string::npos);
    CHECK(text.find("#0 ") != std::string::npos);
    CHECK(text.find("stuck_in_named_function") != std::string::npos);  // the worker's own frame
  }
}

TEST_CASE("diagnosis: no eu-stack, a refused attach, a stuck eu-stack: said, and still killed") {
  Scratch s;
  // A PATH whose eu-stack is a stand-in: refused as without ptrace permission, or stuck.
  auto run_with_eu_stack = [&](const std::string& name, const std::string& script) {
    const std::string bin = s.path(name + "_bin");
    fs::create_directories(bin);
    if (!script.empty()) {
      const std::string fake = bin + "/eu-stack";
      std::ofstream(fake) << "#!/bin/sh\n" << script << "\n";
      fs::permissions(fake, fs::perms::owner_all);
    }
    ChildProcess agent({"/usr/bin/env", "PATH=" + bin, CTRUN_PATH, "--standalone",
                        "--nproc_per_node=1", "--worker_timeout=1", TEST_WORKER_PATH, "hang"},
                       s.path(name + ".log"));
    const auto started = std::chrono::steady_clock::now();
    REQUIRE(agent.wait(60s) == std::optional<int>(1));
    const std::string log = read_file(s.path(name + ".log"));
    INFO(log);
    CHECK(log.find("was killed by SIGKILL") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - started < 30s);
    return log;
  };

  std::string log = run_with_eu_stack("missing", "");
  CHECK(log.find("no native stacks: eu-stack (elfutils) not found on PATH") != std::string::npos);
  CHECK(report_in(log).find("native    : stacks before the kill") != std::string::npos);

  log = run_with_eu_stack(
      "refused",
      "echo \"eu-stack: dwfl_linux_proc_attach pid $2: Operation not permitted\" >&2\n"
      "exit 1");
  CHECK(log.find("no native stacks: eu-stack: dwfl_linux_proc_attach pid ") != std::string::npos);
  CHECK(log.find("eu-stack was not allowed to attach (ptrace)") != std::string::npos);
  CHECK(report_in(log).find("CAP_SYS_PTRACE") != std::string::npos);

  log = run_with_eu_stack("stuck", "echo 'PID 1 - process'\nexec /bin/sleep 60");
  CHECK(log.find("eu-stack did not finish within 5000 ms: stopped") != std::string::npos);
}

TEST_CASE("diagnosis: ranks that fail together are all in the report with their last lines") {
  // Both workers write a line of their own to stderr and exit 3 within a few milliseconds;
  // whichever exit the agent sees first is the root cause, the other is listed under
  // "Failures:" (the others get --monitor-interval to fail too). Repeated: the order of two
  // exits so close varies from run to run.
  Scratch s;
  const std::string script = s.path("fail_together.sh");
  {
    std::ofstream out(script);
    // Each rank waits until both have started (a file each), so that they really fail together.
    out << "#!/bin/sh\ntouch \"$1/started.$RANK\"\n"
        << "while [ \"$(ls \"$1\" | grep -c started)\" -lt 2 ]; do sleep 0.005; done\n"
        << "echo \"rank $RANK gives up: disk $LOCAL_RANK is gone\" >&2\nexit 3\n";
  }
  fs::permissions(script, fs::perms::owner_all);
  for (int run = 0; run < 20; ++run) {
    INFO("run " << run);
    const std::string log_path = s.path("agent" + std::to_string(run) + ".log");
    const std::string barrier = s.path("barrier" + std::to_string(run));
    fs::create_directories(barrier);
    ChildProcess agent(
        ctrun_args({"--standalone", "--nproc_per_node=2", "--no-python", script, barrier}),
        log_path);
    REQUIRE(agent.wait(60s) == std::optional<int>(1));
    const std::string log = read_file(log_path);
    INFO(log);
    const auto failures = log.find("Failures:\n");
    const auto root = log.find("Root Cause (first observed failure):");
    REQUIRE(failures != std::string::npos);
    REQUIRE(root != std::string::npos);
    CHECK(log.find("<NO_OTHER_FAILURES>") == std::string::npos);
    // One rank above the root cause, the other below it; each with its own last line.
    const std::string others = log.substr(failures, root - failures);
    const std::string cause = report_in(log);
    for (int rank : {0, 1}) {
      const std::string line =
          "rank " + std::to_string(rank) + " gives up: disk " + std::to_string(rank) + " is gone";
      const bool listed = others.find("  rank      : " + std::to_string(rank)) != std::string::npos;
      const bool root_cause =
          cause.find("  rank      : " + std::to_string(rank)) != std::string::npos;
      CHECK(listed != root_cause);
      CHECK((listed ? others : cause).find(line) != std::string::npos);
    }
    CHECK(others.find("[1]:") != std::string::npos);
    CHECK(cause.find("[0]:") != std::string::npos);
  }
}
