// Numbers and rank lists as the launcher's messages write them (failure and hang reports,
// straggler lines, `ctrun status`, fault plans): one formatter of each, so that the same value
// reads the same everywhere. Pure.
#pragma once

#include <string>
#include <vector>

namespace ctrun::launcher {

// `value` through a printf conversion of one double ("%.1f", "%.3f s", "%g").
std::string number_text(double value, const char* format);

// "0-6,9": the ranks sorted, duplicates dropped, runs of consecutive ranks as ranges.
std::string rank_ranges(std::vector<int> ranks);

}  // namespace ctrun::launcher
