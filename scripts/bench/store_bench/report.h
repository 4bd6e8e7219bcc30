// store_bench's measurements and the tables printed from them.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace store_bench {

struct Measurement {
  double ops_per_s = 0;  // sets + gets, all clients together
  double get_p50_us = 0;
  double get_p99_us = 0;
  double set_p50_us = 0;
  double client_cpu_us = 0;  // CPU time per op: all client processes together
  double server_cpu_us = 0;  // CPU time per op: the server process
};

// results[backend][clients]: one Measurement per repetition.
using Results = std::map<std::string, std::map<int, std::vector<Measurement>>>;

struct ReportInfo {
  std::vector<int> clients;  // ascending
  int value_bytes = 0;
  int duration_ms = 0;
  int reps = 0;
};

// Prints the tables (medians over repetitions) for "ctrun" against "tcpstore", with
// "ctrun_raw" as a diagnostic column when it was measured.
void print_report(const Results& results, const ReportInfo& info);

}  // namespace store_bench
