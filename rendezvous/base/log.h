// One log line format for every ctrun program: "<UTC time> <component>: <text>" on stderr.
#pragma once

#include <string>
#include <string_view>

namespace ctrun::rendezvous {

void log_line(std::string_view component, std::string_view text);

// This machine's host name (gethostname), as node ids, failure reports and event logs name it.
std::string local_host_name();

}  // namespace ctrun::rendezvous
