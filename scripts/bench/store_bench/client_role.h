// What one client process of store_bench does, and the line it reports.
#pragma once

#include <string>

namespace store_bench {

struct ClientSpec {
  std::string backend;  // "ctrun", "ctrun_raw" or "tcpstore"
  int port = 0;
  int index = 0;  // distinct per client: its keys are "c<index>/k<n>"
  int duration_ms = 1000;
  int value_bytes = 32;
  int distinct_keys = 1024;
};

struct ClientResult {
  long pairs = 0;  // set+get pairs done
  double elapsed_s = 0;
  double get_p50_us = 0;
  double get_p99_us = 0;
  double set_p50_us = 0;
  double cpu_s = 0;  // this process's CPU time (user + system, all threads) in the run
};

// Connects, prints "ready", waits for EOF on stdin (the shared start signal), runs set+get
// pairs for duration_ms, prints format_result(). Returns the exit code.
int run_client(const ClientSpec& spec);

std::string format_result(const ClientResult& r);
bool parse_result(const std::string& line, ClientResult& out);

}  // namespace store_bench
