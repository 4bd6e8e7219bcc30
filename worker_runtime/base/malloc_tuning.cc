#include "ctrun/worker/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>

namespace ctrun::worker {

bool tune_malloc_for_training(const MallocTuning& tuning) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    return false;
  }
  // Setting either also turns off glibc's dynamic threshold adjustment, so they stay put.
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(tuning.mmap_threshold)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(tuning.trim_threshold)) == 1;
}

}  // namespace ctrun::worker
