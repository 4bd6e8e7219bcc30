// The CPU allocator LibTorch uses, wrapped to count the bytes it holds: the memory of every CPU
// tensor, as measured (not computed from shapes) by the ZeRO benchmark.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ctrun::bench {

// Installs the counting wrapper in front of LibTorch's CPU allocator (once; before the tensors
// to be counted are made).
void install_counting_cpu_allocator();
// Bytes of CPU tensor memory held now, and the most held since the last reset_peak().
std::int64_t cpu_bytes_live();
std::int64_t cpu_bytes_peak();
void reset_cpu_peak();

}  // namespace ctrun::bench
