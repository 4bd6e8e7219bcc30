// An environment for tests: a map instead of the process's variables.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace ctrun::testing {

inline std::function<std::optional<std::string>(const std::string&)> env_of(
    std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace ctrun::testing
