#include "launcher/diagnosis/health_checks.h"

#include <algorithm>

namespace ctrun::launcher {

namespace {

std::string mib(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

std::optional<HealthProblem> free_space_problem(const std::string& dir,
                                                std::optional<std::uint64_t> free_bytes,
                                                std::uint64_t min_free_bytes) {
  if (min_free_bytes == 0) return std::nullopt;
  if (!free_bytes) return HealthProblem{"free space", dir + " cannot be read"};
  if (*free_bytes >= min_free_bytes) return std::nullopt;
  return HealthProblem{"free space", dir + " has " + mib(*free_bytes) + " free, below " +
                                         mib(min_free_bytes) + " (--health_min_free_mib)"};
}

std::vector<HealthProblem> gpu_problems(const std::vector<GpuReading>& gpus) {
  std::vector<HealthProblem> out;
  for (const auto& g : gpus) {
    const std::string who =
        "GPU " + std::to_string(g.index) + (g.name.empty() ? "" : " (" + g.name + ")");
    if (!g.error.empty()) {
      out.push_back({"gpu", who + " cannot be read: " + g.error});
      continue;
    }
    std::vector<std::string> faults;
    if (g.uncorrected_ecc) faults.push_back("uncorrected ECC errors");
    if (g.retired_pages_pending) faults.push_back("retired pages pending a reset");
    if (g.row_remap_failed) faults.push_back("a failed row remapping");
    if (faults.empty()) continue;
    std::string text = who + " reports ";
    for (std::size_t i = 0; i < faults.size(); ++i) {
      text += (i == 0 ? "" : i + 1 == faults.size() ? " and " : ", ") + faults[i];
    }
    out.push_back({"gpu", text});
  }
  return out;
}

std::optional<HealthProblem> command_problem(const std::string& command, bool started,
                                             bool succeeded, bool timed_out,
                                             const std::string& output) {
  if (succeeded) return std::nullopt;
  std::string detail = "'" + command + "' ";
  if (!started) {
    detail += "could not run";
  } else if (timed_out) {
    detail += "did not finish in time (--health_check_timeout)";
  } else {
    detail += "failed";
  }
  // The last line it printed says why, as the user's check put it.
  std::string last = output;
  while (!last.empty() && (last.back() == '\n' || last.back() == ' ')) last.pop_back();
  if (const auto nl = last.rfind('\n'); nl != std::string::npos) last = last.substr(nl + 1);
  if (!last.empty()) detail += ": " + last;
  return HealthProblem{"health check command", detail};
}

std::vector<unsigned> gpu_memory_held(const std::vector<GpuReading>& gpus,
                                      const std::vector<int>& stopped_workers) {
  std::vector<unsigned> held;
  for (const auto& g : gpus) {
    for (unsigned pid : g.pids) {
      const bool ours = std::find(stopped_workers.begin(), stopped_workers.end(),
                                  static_cast<int>(pid)) != stopped_workers.end();
      if (ours && std::find(held.begin(), held.end(), pid) == held.end()) held.push_back(pid);
    }
  }
  return held;
}

std::string describe_problems(const std::vector<HealthProblem>& problems) {
  std::string out;
  for (const auto& p : problems) out += (out.empty() ? "" : "; ") + p.check + ": " + p.detail;
  return out;
}

}  // namespace ctrun::launcher
