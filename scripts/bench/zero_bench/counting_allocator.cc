#include "counting_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstring>

// LibTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define CTRUN_ALLOCATE_CONST
#else
#define CTRUN_ALLOCATE_CONST const
#endif

#if __has_include(<c10/core/impl/alloc_cpu.h>)
#include <c10/core/impl/alloc_cpu.h>
#endif

namespace ctrun::bench {
namespace {

std::atomic<std::int64_t> live{0};
std::atomic<std::int64_t> peak{0};

// Each allocation carries its size in a header before the data, which keeps LibTorch's
// 64-byte alignment; data and context are the same pointer, as raw_allocate() requires.
constexpr std::size_t kHeader = 64;

void free_counted(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  std::int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  live -= bytes;
  c10::free_cpu(base);
}

class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) CTRUN_ALLOCATE_CONST override {
    auto* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    const auto bytes = static_cast<std::int64_t>(n);
    std::memcpy(base, &bytes, sizeof bytes);
    const std::int64_t now = live += bytes;
    std::int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    void* data = base + kHeader;
    return {data, data, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

void install_counting_cpu_allocator() {
  static CountingAllocator allocator;
  c10::SetCPUAllocator(&allocator, /*priority=*/100);
}

std::int64_t cpu_bytes_live() { return live.load(); }
std::int64_t cpu_bytes_peak() { return peak.load(); }
void reset_cpu_peak() { peak = live.load(); }

}  // namespace ctrun::bench
