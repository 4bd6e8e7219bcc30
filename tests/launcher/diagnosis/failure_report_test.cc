// The root-cause report beyond torchrun: a worker without an error file explained by the end of
// its stderr, a hung one by its stacks. (Its torchrun layout: worker_env_test.cc.)
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "catch.h"
#include "ctrun/launcher/failure_report.h"

using namespace ctrun::launcher;

namespace {

FailureInfo failed_worker() {
  FailureInfo info;
  info.entrypoint = "train.py";
  info.host = "node3";
  info.rank = 5;
  info.local_rank = 1;
  info.pid = 4242;
  info.exit_code = 1;
  info.error_file = "/nonexistent/error.json";
  return info;
}

const std::vector<std::string> kTraceback = {"epoch 3: loss=0.25",
                                             "Traceback (most recent call last):",
                                             "  File \"/x/train.py\", line 9, in <module>",
                                             "    main()",
                                             "ValueError: boom",
                                             ""};

}  // namespace

TEST_CASE("failure report: without an error file, the traceback from stderr and the log path") {
  FailureInfo info = failed_worker();
  info.stderr_tail = kTraceback;
  info.stderr_log = "/logs/run/attempt_0/1/stderr.log";
  const std::string report = format_failure_report(info);
  CHECK(report.find("error_file: <N/A>\n") != std::string::npos);
  CHECK(report.find("  stderr    : /logs/run/attempt_0/1/stderr.log\n") != std::string::npos);
  CHECK(report.find("  traceback : no error file (see "
                    "https://pytorch.org/docs/stable/elastic/errors.html); the end of its "
                    "stderr:\n              Traceback (most recent call last):\n") !=
        std::string::npos);
  CHECK(report.find("              ValueError: boom\n====") != std::string::npos);
  CHECK(report.find("epoch 3") == std::string::npos);  // the traceback alone
  CHECK(report.find("native") == std::string::npos);
  CHECK(exception_from_stderr(info.stderr_tail) == std::optional<std::string>("ValueError: boom"));

  // Nothing on stderr: torchrun's own words.
  info.stderr_tail.clear();
  info.stderr_log.clear();
  const std::string silent = format_failure_report(info);
  CHECK(silent.find("  traceback : To enable traceback see: "
                    "https://pytorch.org/docs/stable/elastic/errors.html\n") != std::string::npos);
  CHECK(silent.find("stderr    :") == std::string::npos);
}

TEST_CASE("failure report: stderr excerpts: chained tracebacks, plain lines, faulthandler") {
  const std::vector<std::string> chained = {
      "noise",
      "Traceback (most recent call last):",
      "  File \"a.py\", line 1, in f",
      "KeyError: 'x'",
      "",
      "During handling of the above exception, another exception occurred:",
      "",
      "Traceback (most recent call last):",
      "  File \"a.py\", line 3, in <module>",
      "RuntimeError: while handling"};
  StderrExcerpt e = stderr_excerpt(chained);
  CHECK(e.from_python);
  CHECK(e.lines.size() == chained.size() - 1);  // from the first traceback of the chain
  CHECK(exception_from_stderr(chained) ==
        std::optional<std::string>("RuntimeError: while handling"));

  std::vector<std::string> plain;
  for (int i = 0; i < 50; ++i) plain.push_back("line " + std::to_string(i));
  plain.push_back("");
  e = stderr_excerpt(plain);
  CHECK_FALSE(e.from_python);
  REQUIRE(e.lines.size() == StderrExcerpt::kPlainLines);
  CHECK(e.lines.back() == "line 49");  // trailing blank lines dropped
  CHECK_FALSE(exception_from_stderr(plain).has_value());

  const std::vector<std::string> dump = {"step 10",
                                         "Fatal Python error: Aborted",
                                         "",
                                         "Thread 0x00007f (most recent call first):",
                                         "  File \"h.py\", line 5 in sleeper",
                                         "",
                                         "Current thread 0x00007e (most recent call first):",
                                         "  File \"h.py\", line 9 in <module>"};
  e = stderr_excerpt(dump);
  CHECK(e.from_python);
  CHECK(e.lines.front() == "Fatal Python error: Aborted");
  CHECK_FALSE(exception_from_stderr(dump).has_value());  // stacks, not an exception
  // A traceback whose exception line is not there (yet) names no exception.
  CHECK_FALSE(exception_from_stderr({"Traceback (most recent call last):", "  File \"a\""}));
}

TEST_CASE("failure report: a hung worker: the agent's error file, Python and native stacks") {
  const std::string path = "ctrun_failure_report_hung.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(R"({"message": "no heartbeat for 1.2 s (--worker_timeout=1): killed as hung"})", f);
    std::fclose(f);
  }
  FailureInfo info = failed_worker();
  info.error_file = path;
  info.exit_code = 0;
  info.signal = 6;
  info.hung = true;
  info.stderr_tail = {
      "Fatal Python error: Aborted", "",
      "Thread 0x00007f (most recent call first):", "  File \"h.py\", line 5 in sleeper"};
  std::string native = "PID 4242 - process\nTID 4242:\n";
  for (int i = 0; i < 30; ++i) {
    native += '#';  // appended: g++ 12 -O3 warns falsely on "literal" + std::string&&
    native += std::to_string(i) + "  0x1 frame_" + std::to_string(i) + "\n";
  }
  info.native_stacks = native;
  const std::string report = format_failure_report(info);
  CHECK(report.find("error_file: " + path) != std::string::npos);
  CHECK(report.find("traceback : no heartbeat for 1.2 s (--worker_timeout=1): killed as hung\n") !=
        std::string::npos);
  CHECK(report.find("  stderr_end: the last lines of its stderr:\n"
                    "              Fatal Python error: Aborted\n") != std::string::npos);
  CHECK(report.find("in sleeper") != std::string::npos);
  CHECK(report.find("  native    : stacks before the kill (eu-stack -p 4242):\n"
                    "              PID 4242 - process\n              TID 4242:\n") !=
        std::string::npos);
  CHECK(report.find("frame_7\n") != std::string::npos);
  CHECK(report.find("frame_8\n") == std::string::npos);  // the report is short; the log has all
  CHECK(report.find("... 22 more frames") != std::string::npos);
  CHECK(report.find("signal    : 6 (SIGABRT)") != std::string::npos);

  // A worker's own error file says it all: its stderr is not repeated.
  info.hung = false;
  info.native_stacks.clear();
  const std::string recorded = format_failure_report(info);
  CHECK(recorded.find("stderr_end") == std::string::npos);
  CHECK(recorded.find("Fatal Python error") == std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("failure report: every failed rank is listed, the first observed as the root cause") {
  FailureInfo first = failed_worker();
  first.rank = 3;
  first.local_rank = 1;
  first.pid = 111;
  first.exit_code = 2;
  first.stderr_tail = {"first rank's last words"};
  FailureInfo second = first;
  second.rank = 2;
  second.local_rank = 0;
  second.pid = 222;
  second.exit_code = 0;
  second.signal = 6;
  second.stderr_tail = {"second rank's last words"};
  const std::string report = format_failure_report(std::vector<FailureInfo>{first, second});
  INFO(report);
  const auto failures = report.find("Failures:\n[1]:\n");
  const auto root = report.find("Root Cause (first observed failure):\n[0]:\n");
  REQUIRE(failures != std::string::npos);
  REQUIRE(root != std::string::npos);
  CHECK(failures < root);
  CHECK(report.find("<NO_OTHER_FAILURES>") == std::string::npos);
  const std::string others = report.substr(failures, root - failures);
  const std::string cause = report.substr(root);
  CHECK(others.find("  rank      : 2 (local_rank: 0)") != std::string::npos);
  CHECK(others.find("  exitcode  : -6 (pid: 222)") != std::string::npos);
  CHECK(others.find("second rank's last words") != std::string::npos);
  CHECK(cause.find("  rank      : 3 (local_rank: 1)") != std::string::npos);
  CHECK(cause.find("first rank's last words") != std::string::npos);
  CHECK(cause.find("second rank's last words") == std::string::npos);
  // One failure: torchrun's placeholder.
  CHECK(format_failure_report(first).find("Failures:\n  <NO_OTHER_FAILURES>\n") !=
        std::string::npos);
}

TEST_CASE("failure report: the one-line summary names the rank and the cause") {
  FailureInfo info = failed_worker();
  CHECK(failure_summary(info) == "rank 5 on node3: exit code 1");
  info.stderr_tail = kTraceback;
  CHECK(failure_summary(info) == "rank 5 on node3: ValueError: boom");
  FailureInfo killed = failed_worker();
  killed.exit_code = 0;
  killed.signal = SIGKILL;
  CHECK(failure_summary(killed) == "rank 5 on node3: SIGKILL");
}
