#include "launcher/workers/stderr_tail.h"

#include <string>

#include "catch.h"

using ctrun::launcher::StderrTail;

namespace {

void feed(StderrTail& t, const std::string& text) { t.append(text.data(), text.size()); }

}  // namespace

TEST_CASE("stderr tail: lines from chunks cut anywhere, an unfinished last line included") {
  StderrTail t;
  feed(t, "first li");
  feed(t, "ne\nsecond\n\nthi");
  CHECK(t.lines() == std::vector<std::string>{"first line", "second", "", "thi"});
  feed(t, "rd\n");
  CHECK(t.lines() == std::vector<std::string>{"first line", "second", "", "third"});
}

TEST_CASE("stderr tail: bounded in lines, in bytes and per line") {
  StderrTail t;
  for (int i = 0; i < 1000; ++i) feed(t, "line " + std::to_string(i) + "\n");
  auto lines = t.lines();
  REQUIRE(lines.size() == StderrTail::kMaxLines);
  CHECK(lines.back() == "line 999");
  CHECK(lines.front() == "line " + std::to_string(1000 - StderrTail::kMaxLines));

  StderrTail wide;
  const std::string long_line(3000, 'x');
  for (int i = 0; i < 20; ++i) feed(wide, long_line + "\n");
  lines = wide.lines();
  std::size_t bytes = 0;
  for (const auto& l : lines) {
    CHECK(l.size() == StderrTail::kMaxLineBytes + 3);
    CHECK(l.substr(l.size() - 3) == "...");
    bytes += l.size();
  }
  CHECK(bytes <= StderrTail::kMaxBytes + 3 * lines.size());
  CHECK(lines.size() < 20);

  StderrTail unfinished;  // a line that never ends stays bounded too
  for (int i = 0; i < 100; ++i) feed(unfinished, long_line);
  REQUIRE(unfinished.lines().size() == 1);
  CHECK(unfinished.lines()[0].size() == StderrTail::kMaxLineBytes + 3);
}

TEST_CASE("stderr tail: a progress bar redrawn with carriage returns is its last state") {
  StderrTail t;
  feed(t, "epoch 1\n 10%|#   |\r 50%|##  |\r100%|####|\nTraceback (most recent call last):\r\n");
  CHECK(t.lines() ==
        std::vector<std::string>{"epoch 1", "100%|####|", "Traceback (most recent call last):"});
}
