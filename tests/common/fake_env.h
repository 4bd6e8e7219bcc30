// An environment for tests: a map instead of the process's variables.
#pragma once

#include <cstdint>
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

// What ctrun --fault_tolerance=step gives worker `replica` of job `job` (world size 1) whose
// store is the ctrund on 127.0.0.1:`port`.
inline std::map<std::string, std::string> fault_tolerant_worker_vars(std::uint16_t port,
                                                                     const std::string& replica,
                                                                     const std::string& job) {
  return {{"RANK", "0"},
          {"WORLD_SIZE", "1"},
          {"TORCHELASTIC_RUN_ID", job},
          {"CTRUN_STORE_ADDR", "127.0.0.1"},
          {"CTRUN_STORE_PORT", std::to_string(port)},
          {"CTRUN_FAULT_TOLERANCE", "step"},
          {"CTRUN_REPLICA_ID", replica}};
}

}  // namespace ctrun::testing
