#include "ctrun/worker/error_file.h"

#include <cstdio>
#include <stdexcept>

#include "catch.h"
#include "ctrun/launcher/failure_report.h"

using namespace ctrun::worker;

TEST_CASE("error file: the agent's report reads what a C++ worker writes") {
  const std::string path = "ctrun_error_file_test.json";
  std::remove(path.c_str());
  const int code = run_recorded(path, []() -> int { throw std::runtime_error("loss is NaN"); });
  CHECK(code == 1);
  auto message = ctrun::launcher::read_error_file(path);
  REQUIRE(message);
  CHECK(*message == "std::runtime_error: loss is NaN");
  REQUIRE(write_error_file(path, "RuntimeError: boom", "Traceback:\n  boom\n"));
  CHECK(ctrun::launcher::read_error_file(path).value() == "Traceback:\n  boom\n");
  std::remove(path.c_str());
}

TEST_CASE("error file: a clean run writes nothing and keeps its exit code") {
  const std::string path = "ctrun_error_file_clean.json";
  std::remove(path.c_str());
  CHECK(run_recorded(path, [] { return 7; }) == 7);
  CHECK_FALSE(ctrun::launcher::read_error_file(path));
  CHECK(run_recorded("", []() -> int { throw 42; }) == 1);  // no file asked for
}

TEST_CASE("error file: an unwritable path is an error, not a crash") {
  auto s = write_error_file("/nonexistent/dir/error.json", "m");
  REQUIRE_FALSE(s);
  CHECK(s.error().message.find("/nonexistent/dir/error.json") != std::string::npos);
}
