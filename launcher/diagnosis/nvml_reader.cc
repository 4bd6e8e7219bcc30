#include "launcher/diagnosis/nvml_reader.h"

#include <dlfcn.h>

#include <mutex>

namespace ctrun::launcher {

namespace {

// The few NVML calls used, as nvml.h declares them (a stable C ABI): no header needed.
using Return = int;  // nvmlReturn_t
using Device = void*;
constexpr Return kSuccess = 0;
constexpr Return kInsufficientSize = 7;
constexpr int kUncorrected = 1;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kVolatile = 0;     // NVML_VOLATILE_ECC

struct ProcessInfo {  // nvmlProcessInfo_t of the _v2 and _v3 calls
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

struct Nvml {
  Return (*init)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*count)(unsigned int*) = nullptr;
  Return (*handle)(unsigned int, Device*) = nullptr;
  Return (*name)(Device, char*, unsigned int) = nullptr;
  Return (*ecc)(Device, int, int, unsigned long long*) = nullptr;
  Return (*retired_pending)(Device, int*) = nullptr;
  Return (*remapped_rows)(Device, unsigned int*, unsigned int*, unsigned int*,
                          unsigned int*) = nullptr;
  Return (*processes)(Device, unsigned int*, ProcessInfo*) = nullptr;
  std::string error;  // why it is not usable; empty: usable
};

template <typename F>
void find(void* lib, F& f, const char* symbol) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
}

// Opened and started once per process; the library stays loaded.
const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      n.error = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
      return;
    }
    find(lib, n.init, "nvmlInit_v2");
    find(lib, n.error_string, "nvmlErrorString");
    find(lib, n.count, "nvmlDeviceGetCount_v2");
    find(lib, n.handle, "nvmlDeviceGetHandleByIndex_v2");
    find(lib, n.name, "nvmlDeviceGetName");
    find(lib, n.ecc, "nvmlDeviceGetTotalEccErrors");
    find(lib, n.retired_pending, "nvmlDeviceGetRetiredPagesPendingStatus");
    find(lib, n.remapped_rows, "nvmlDeviceGetRemappedRows");
    find(lib, n.processes, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!n.processes) find(lib, n.processes, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!n.init || !n.count || !n.handle) {
      n.error = "libnvidia-ml.so.1 lacks nvmlInit_v2 or the device calls";
      return;
    }
    if (const Return r = n.init(); r != kSuccess) {
      n.error = std::string("nvmlInit failed: ") +
                (n.error_string ? n.error_string(r) : std::to_string(r).c_str());
    }
  });
  return n;
}

std::string words(const Nvml& n, Return r) {
  return n.error_string ? n.error_string(r) : "NVML error " + std::to_string(r);
}

}  // namespace

std::optional<std::vector<GpuReading>> read_gpus(std::string* why) {
  const Nvml& n = nvml();
  if (!n.error.empty()) {
    if (why) *why = n.error;
    return std::nullopt;
  }
  unsigned int count = 0;
  if (const Return r = n.count(&count); r != kSuccess) {
    if (why) *why = "nvmlDeviceGetCount: " + words(n, r);
    return std::nullopt;
  }
  std::vector<GpuReading> gpus;
  for (unsigned int i = 0; i < count; ++i) {
    GpuReading g;
    g.index = i;
    Device device = nullptr;
    if (const Return r = n.handle(i, &device); r != kSuccess) {
      g.error = words(n, r);
      gpus.push_back(std::move(g));
      continue;
    }
    char name[96] = {};
    if (n.name && n.name(device, name, sizeof name) == kSuccess) g.name = name;
    // A check the GPU does not support (NVML_ERROR_NOT_SUPPORTED) reads as no fault.
    unsigned long long ecc = 0;
    if (n.ecc && n.ecc(device, kUncorrected, kVolatile, &ecc) == kSuccess) {
      g.uncorrected_ecc = ecc > 0;
    }
    int pending = 0;
    if (n.retired_pending && n.retired_pending(device, &pending) == kSuccess) {
      g.retired_pages_pending = pending != 0;
    }
    unsigned int corrected = 0, uncorrected = 0, remap_pending = 0, failed = 0;
    if (n.remapped_rows &&
        n.remapped_rows(device, &corrected, &uncorrected, &remap_pending, &failed) == kSuccess) {
      g.row_remap_failed = failed != 0;
    }
    if (n.processes) {
      std::vector<ProcessInfo> infos(64);
      for (int attempt = 0; attempt < 3; ++attempt) {
        unsigned int size = static_cast<unsigned int>(infos.size());
        const Return r = n.processes(device, &size, infos.data());
        if (r == kInsufficientSize) {
          infos.resize(size + 16);
          continue;
        }
        if (r == kSuccess) {
          for (unsigned int k = 0; k < size && k < infos.size(); ++k)
            g.pids.push_back(infos[k].pid);
        }
        break;
      }
    }
    gpus.push_back(std::move(g));
  }
  return gpus;
}

}  // namespace ctrun::launcher
