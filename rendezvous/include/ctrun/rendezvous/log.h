// One log line format for every ctrun program: "<UTC time> <component>: <text>" on stderr.
#pragma once

#include <string_view>

namespace ctrun::rendezvous {

void log_line(std::string_view component, std::string_view text);

}  // namespace ctrun::rendezvous
