// --duplicate-std{out,err}-filters through OutputSink: the lines a sink writes to the console
// that contain a filter are copied, with the console prefix, into the shared filtered file.
#include "launcher/workers/filtered_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <string>

#include "catch.h"
#include "launcher/workers/output_sink.h"
#include "process.h"

using ctrun::launcher::FilteredLog;
using ctrun::launcher::OutputSink;
using ctrun::testing::read_file;
using ctrun::testing::ScratchDir;

namespace {

// A file standing in for the agent's console: the descriptor OutputSink writes to.
class ConsoleFile {
 public:
  explicit ConsoleFile(std::string path)
      : path_(std::move(path)),
        fd_(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
    REQUIRE(fd_ >= 0);
  }
  ~ConsoleFile() { ::close(fd_); }
  ConsoleFile(const ConsoleFile&) = delete;
  ConsoleFile& operator=(const ConsoleFile&) = delete;
  int fd() const { return fd_; }
  std::string text() const { return read_file(path_); }

 private:
  std::string path_;
  int fd_;
};

std::shared_ptr<FilteredLog> open_log(const std::string& path, std::vector<std::string> filters) {
  auto log = FilteredLog::open(path, std::move(filters));
  INFO((log ? "" : log.error().message));
  REQUIRE(log.ok());
  return log.value();
}

void feed(OutputSink& sink, const std::string& text) { sink.write(text.data(), text.size()); }

}  // namespace

TEST_CASE("filtered log: console lines holding a filter are copied with their prefix") {
  ScratchDir dir("filtered_log");
  ConsoleFile console(dir.path("console"));
  auto filtered = open_log(dir.path("filtered_stdout.log"), {"apple", "orange"});
  {
    OutputSink rank0(console.fd(), "[default0]:", "", filtered);
    OutputSink rank1(console.fd(), "[default1]:", "", filtered);
    feed(rank0, "apple pie\nbanana\nor");  // a line cut anywhere is matched once it is whole
    feed(rank1, "no fruit here\nred apple\n");
    feed(rank0, "ange juice\nlast apple");
    rank0.finish();  // the last line has no newline: copied with one, as on the console
  }
  CHECK(read_file(dir.path("filtered_stdout.log")) ==
        "[default0]:apple pie\n[default1]:red apple\n[default0]:orange juice\n"
        "[default0]:last apple\n");
  // The console has every line; the copy holds exactly the console's lines that match.
  CHECK(console.text() ==
        "[default0]:apple pie\n[default0]:banana\n[default1]:no fruit here\n"
        "[default1]:red apple\n[default0]:orange juice\n[default0]:last apple\n");
}

TEST_CASE("filtered log: nothing from streams off the console or from the agent's notes") {
  ScratchDir dir("filtered_log");
  ConsoleFile console(dir.path("console"));
  auto filtered = open_log(dir.path("filtered_stderr.log"), {"pear"});
  {
    // --redirects (or --local_ranks_filter) keeps this stream off the console: no copy, though
    // its file still gets every byte.
    OutputSink redirected(-1, "[default0]:", dir.path("stderr.log"), filtered);
    feed(redirected, "pear to file only\n");
    redirected.finish();
    OutputSink shown(console.fd(), "[default1]:", "", filtered);
    shown.write_note("pear in the agent's own note\n");
    feed(shown, "plum\n");
  }
  CHECK(read_file(dir.path("stderr.log")) == "pear to file only\n");
  CHECK(console.text() == "[default1]:pear in the agent's own note\n[default1]:plum\n");
  CHECK(read_file(dir.path("filtered_stderr.log")).empty());
}

TEST_CASE("filtered log: torchrun's matching: an empty filter and the line's own newline") {
  ScratchDir dir("filtered_log");
  ConsoleFile console(dir.path("console"));
  SECTION("an empty filter copies every line") {
    auto every = open_log(dir.path("every.log"), {""});
    OutputSink sink(console.fd(), "[r0]:", "", every);
    feed(sink, "one\n\ntwo\n");
    CHECK(read_file(dir.path("every.log")) == "[r0]:one\n[r0]:\n[r0]:two\n");
  }
  SECTION("filters see the line with its newline, as torchrun's readline() gives it") {
    auto ends_in_a = open_log(dir.path("ends.log"), {"a\n"});
    OutputSink sink(console.fd(), "[r0]:", "", ends_in_a);
    feed(sink, "banana\napple\nbanana");
    sink.finish();  // the unterminated "banana" has no newline to match
    CHECK(read_file(dir.path("ends.log")) == "[r0]:banana\n");
  }
}

TEST_CASE("filtered log: open truncates and an unopenable path is an error naming it") {
  ScratchDir dir("filtered_log");
  std::ofstream(dir.path("filtered_stdout.log")) << "an earlier attempt's lines\n";
  auto fresh = open_log(dir.path("filtered_stdout.log"), {"x"});
  CHECK(fresh->path() == dir.path("filtered_stdout.log"));
  CHECK(read_file(dir.path("filtered_stdout.log")).empty());

  const std::string missing = dir.path("no/such/dir/filtered_stdout.log");
  auto failed = FilteredLog::open(missing, {"x"});
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message.find("'" + missing + "'") != std::string::npos);
}

TEST_CASE("output sink: a log file write that fails is told once and the file given up") {
  // /dev/full: every write fails with ENOSPC, as on a full disk.
  OutputSink sink(-1, "[default0]:", "/dev/full");
  REQUIRE(sink.file_ok());
  int told = 0;
  std::string path;
  int error = 0;
  sink.set_file_error_handler([&](const std::string& p, int e) {
    ++told;
    path = p;
    error = e;
  });
  const std::string line = "a line for the log\n";
  sink.write(line.data(), line.size());
  sink.write(line.data(), line.size());
  sink.write_note("ctrun: a note");
  CHECK(told == 1);
  CHECK(path == "/dev/full");
  CHECK(error == ENOSPC);
}

TEST_CASE("filtered log: a write that fails is told once and the copy given up") {
  auto log = FilteredLog::open("/dev/full", {"apple"});  // every write fails with ENOSPC
  REQUIRE(log.ok());
  int told = 0;
  int error = 0;
  log.value()->set_file_error_handler([&](const std::string& path, int e) {
    ++told;
    error = e;
    CHECK(path == "/dev/full");
  });
  log.value()->offer("[default0]:", "an apple\n");
  log.value()->offer("[default1]:", "another apple\n");
  log.value()->offer("[default1]:", "a pear\n");
  CHECK(told == 1);
  CHECK(error == ENOSPC);
}
