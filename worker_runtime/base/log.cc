#include "ctrun/worker/log.h"

#include <cstdio>

namespace ctrun::worker {

void log_rank0(int rank, const std::string& line) {
  if (rank != 0) return;
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

}  // namespace ctrun::worker
