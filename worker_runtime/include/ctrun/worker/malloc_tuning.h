// glibc malloc settings for training loops. A training step allocates and frees the same large
// tensors (activations, gradients) every step; with glibc's defaults, blocks above the mmap
// threshold and free memory at the top of the heap go back to the kernel, so the next step
// page-faults them in again (10 % of an mlp step here, docs/benchmarks.md). Raising both
// thresholds keeps that memory in the process for reuse.
#pragma once

#include <cstddef>

namespace ctrun::worker {

struct MallocTuning {
  std::size_t mmap_threshold = std::size_t{64} << 20;   // larger blocks still get their own mmap
  std::size_t trim_threshold = std::size_t{256} << 20;  // free heap kept before trimming
};

// Applies `tuning` with mallopt(), unless the user chose their own through glibc's
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (theirs win). Returns whether it applied.
bool tune_malloc_for_training(const MallocTuning& tuning = {});

}  // namespace ctrun::worker
