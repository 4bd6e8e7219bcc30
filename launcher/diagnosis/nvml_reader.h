// NVIDIA's management library (libnvidia-ml.so.1, the driver's), opened with dlopen when it is
// there: ctrun has no build dependency on it, and a machine without NVIDIA's driver reads as
// having no GPUs to check.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/diagnosis/health_checks.h"

namespace ctrun::launcher {

// Every GPU NVML sees; nullopt (with `why`, when given) where NVML cannot be opened or started.
std::optional<std::vector<GpuReading>> read_gpus(std::string* why = nullptr);

}  // namespace ctrun::launcher
