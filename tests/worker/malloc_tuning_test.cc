#include "ctrun/worker/malloc_tuning.h"

#include <stdlib.h>

#include "catch.h"

TEST_CASE("malloc tuning: applies, unless the user set glibc's variables") {
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  unsetenv("MALLOC_TRIM_THRESHOLD_");
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer's allocator replaces glibc's: mallopt says no
  CHECK(ctrun::worker::tune_malloc_for_training());
#endif
  setenv("MALLOC_TRIM_THRESHOLD_", "1000", 1);
  CHECK_FALSE(ctrun::worker::tune_malloc_for_training());
  unsetenv("MALLOC_TRIM_THRESHOLD_");
}
