// Whether this node is fit to join a round: what the agent checks before each join (the first
// and every later one), decided from readings the agent takes (free space, the GPUs as NVIDIA's
// management library reports them, a user's command). Pure: readings in, problems out.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ctrun::launcher {

struct HealthSettings {
  std::string command;                               // --health_check: exit 0 = healthy; "": none
  std::chrono::milliseconds command_timeout{60000};  // --health_check_timeout
  std::chrono::milliseconds interval{30000};    // --health_check_interval: between failed checks
  std::uint64_t min_free_bytes = 100ULL << 20;  // --health_min_free_mib, for each of `dirs`
  std::vector<std::string> dirs;                // the log directory and --health_check_dirs
  // How long a restart waits for the GPU memory of the workers it stopped to be released.
  std::chrono::milliseconds gpu_release_timeout{30000};
};

// One GPU as NVIDIA's management library (NVML) reports it.
struct GpuReading {
  unsigned index = 0;
  std::string name;
  std::string error;                   // the device could not be read: NVML's words
  bool uncorrected_ecc = false;        // volatile uncorrected ECC errors since the driver loaded
  bool retired_pages_pending = false;  // pages waiting for retirement: the GPU needs a reset
  bool row_remap_failed = false;       // a row remapping failed: the GPU needs service
  std::vector<unsigned> pids;          // processes holding memory on it
};

struct HealthProblem {
  std::string check;  // "free space", "gpu", "health check command"
  std::string detail;
};

// A directory's free space against the minimum; nullopt free: it could not be read.
std::optional<HealthProblem> free_space_problem(const std::string& dir,
                                                std::optional<std::uint64_t> free_bytes,
                                                std::uint64_t min_free_bytes);
// Each GPU that could not be read or reports a fault that makes it unfit.
std::vector<HealthProblem> gpu_problems(const std::vector<GpuReading>& gpus);
// The user's command, as run: a problem unless it exited 0 within its time; `output` its last
// lines.
std::optional<HealthProblem> command_problem(const std::string& command, bool started,
                                             bool succeeded, bool timed_out,
                                             const std::string& output);
// The workers of the group just stopped that NVML still lists as holding GPU memory: the driver
// has not released it yet. (In a container NVML may list the host's pids, which match none:
// then nothing is waited for.)
std::vector<unsigned> gpu_memory_held(const std::vector<GpuReading>& gpus,
                                      const std::vector<int>& stopped_workers);

// "free space: /logs has 12 MiB free, below --health_min_free_mib=100; gpu: ..."
std::string describe_problems(const std::vector<HealthProblem>& problems);

}  // namespace ctrun::launcher
