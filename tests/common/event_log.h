// Test helper: the events an agent or daemon wrote to its --event_log file (JSON lines) under
// one name, in order.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "ctrun/rendezvous/json.h"
#include "process.h"

namespace ctrun::testing {

inline std::vector<rendezvous::Json> events_named(const std::string& path,
                                                  const std::string& name) {
  std::vector<rendezvous::Json> out;
  std::istringstream lines(read_file(path));
  for (std::string line; std::getline(lines, line);) {
    rendezvous::Json e = rendezvous::Json::parse(line, nullptr, false);
    if (e.is_object() && e.value("event", "") == name) out.push_back(std::move(e));
  }
  return out;
}

}  // namespace ctrun::testing
