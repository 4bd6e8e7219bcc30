// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, expanded as Python's string.Template.safe_substitute
// (expected texts checked with CPython).
#include "ctrun/launcher/log_line_prefix.h"

#include "catch.h"

using ctrun::launcher::console_prefix;

TEST_CASE("log line prefix: the default is [role rank]:") {
  CHECK(console_prefix("", "default", 0, 0) == "[default0]:");
  CHECK(console_prefix("", "trainer", 5, 1) == "[trainer5]:");
}

TEST_CASE("log line prefix: the template's names") {
  auto expand = [](const std::string& t) { return console_prefix(t, "trainer", 5, 1); };
  CHECK(expand("[${role_name}${rank}|${local_rank}]:") == "[trainer5|1]:");
  CHECK(expand("$rank:") == "5:");
  CHECK(expand("${rank}x$local_rank") == "5x1");
  CHECK(expand("$role_name-$rank ") == "trainer-5 ");
}

TEST_CASE("log line prefix: anything else is kept as written") {
  auto expand = [](const std::string& t) { return console_prefix(t, "trainer", 5, 1); };
  CHECK(expand("$$rank") == "$rank");
  CHECK(expand("${rank") == "${rank");
  CHECK(expand("$ranks") == "$ranks");
  CHECK(expand("${foo}") == "${foo}");
  CHECK(expand("$1") == "$1");
  CHECK(expand("cost $") == "cost $");
  CHECK(expand("$Rank") == "$Rank");
  CHECK(expand("plain") == "plain");
}
