// Library exceptions (c10's above all) append C++ stack traces after the first line; error
// messages and logs quote only the first.
#pragma once

#include <string>

namespace ctrun::worker {

inline std::string first_line(const std::string& what) { return what.substr(0, what.find('\n')); }

}  // namespace ctrun::worker
