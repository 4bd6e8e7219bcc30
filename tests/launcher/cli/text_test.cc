// The launcher's one formatter of numbers and of rank lists.
#include "launcher/cli/text.h"

#include "catch.h"

using ctrun::launcher::number_text;
using ctrun::launcher::rank_ranges;

TEST_CASE("text: rank lists as ranges, sorted and without duplicates") {
  CHECK(rank_ranges({}) == "");
  CHECK(rank_ranges({4}) == "4");
  CHECK(rank_ranges({5, 1, 2, 3, 9, 2}) == "1-3,5,9");
  CHECK(rank_ranges({7, 6, 5, 4}) == "4-7");
  CHECK(rank_ranges({3, 4, 9, 10, 11}) == "3-4,9-11");
  CHECK(rank_ranges({0, 2, 4}) == "0,2,4");
}

TEST_CASE("text: numbers through one printf conversion") {
  CHECK(number_text(2.5, "%.1f") == "2.5");
  CHECK(number_text(0.1234, "%.3f s") == "0.123 s");
  CHECK(number_text(1.75, "%g") == "1.75");
  CHECK(number_text(3.0, "%.2f") == "3.00");
}
