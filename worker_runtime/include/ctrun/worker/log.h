// Rank-0 logging for trainers: one line on stdout from rank 0 only, so N workers do not print
// the same progress N times (the seeds' `if rank == 0: print(...)`).
#pragma once

#include <string>

namespace ctrun::worker {

// Prints `line` on stdout (flushed) when `rank` is 0.
void log_rank0(int rank, const std::string& line);

// "1234.5": fixed-point with `decimals` digits, for log lines.
std::string fixed(double value, int decimals);

}  // namespace ctrun::worker
