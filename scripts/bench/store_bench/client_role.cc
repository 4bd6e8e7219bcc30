#include "client_role.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <vector>

#include "../common/stats.h"
#include "store_client.h"

namespace store_bench {
namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Blocks until the orchestrator closes the write end of our stdin: every client starts at once.
void wait_for_start() {
  char byte;
  while (true) {
    const ssize_t n = ::read(0, &byte, 1);
    if (n <= 0) return;  // EOF (or error): go
  }
}

}  // namespace

std::string format_result(const ClientResult& r) {
  char line[256];
  std::snprintf(
      line, sizeof line,
      "result pairs=%ld elapsed_s=%.6f get_p50_us=%.2f get_p99_us=%.2f set_p50_us=%.2f cpu_s=%.6f",
      r.pairs, r.elapsed_s, r.get_p50_us, r.get_p99_us, r.set_p50_us, r.cpu_s);
  return line;
}

bool parse_result(const std::string& line, ClientResult& out) {
  return std::sscanf(line.c_str(),
                     "result pairs=%ld elapsed_s=%lf get_p50_us=%lf get_p99_us=%lf set_p50_us=%lf "
                     "cpu_s=%lf",
                     &out.pairs, &out.elapsed_s, &out.get_p50_us, &out.get_p99_us, &out.set_p50_us,
                     &out.cpu_s) == 6;
}

int run_client(const ClientSpec& spec) {
  try {
    auto store = spec.backend == "ctrun"          ? connect_ctrun(spec.port, false)
                 : spec.backend == "ctrun_posted" ? connect_ctrun(spec.port, true)
                 : spec.backend == "ctrun_raw"    ? connect_ctrun_raw(spec.port)
                                                  : connect_tcpstore(spec.port);
    const std::string value(static_cast<std::size_t>(spec.value_bytes), 'v');
    std::vector<std::string> keys;
    for (int k = 0; k < spec.distinct_keys; ++k) {
      char key[64];  // snprintf: g++ 12 -O3 raises a false -Wrestrict on chained string +
      std::snprintf(key, sizeof key, "c%d/k%d", spec.index, k);
      keys.emplace_back(key);
    }
    std::vector<double> get_us, set_us;
    get_us.reserve(1 << 20);
    set_us.reserve(1 << 20);

    std::printf("ready\n");
    std::fflush(stdout);
    wait_for_start();

    const double cpu_start = cpu_seconds();
    const auto start = Clock::now();
    const auto end = start + std::chrono::milliseconds(spec.duration_ms);
    long pairs = 0;
    auto now = start;
    while (now < end) {
      const std::string& key = keys[static_cast<std::size_t>(pairs % spec.distinct_keys)];
      const auto before_set = now;
      store->set(key, value);
      const auto after_set = Clock::now();
      const std::string got = store->get(key);
      now = Clock::now();
      if (got != value) throw std::runtime_error("get returned a different value for " + key);
      set_us.push_back(micros(after_set - before_set));
      get_us.push_back(micros(now - after_set));
      ++pairs;
    }
    store->finish();
    ClientResult r;
    r.cpu_s = cpu_seconds() - cpu_start;
    r.pairs = pairs;
    r.elapsed_s = std::chrono::duration<double>(now - start).count();
    r.get_p50_us = bench::quantile(get_us, 0.5);
    r.get_p99_us = bench::quantile(get_us, 0.99);
    r.set_p50_us = bench::quantile(set_us, 0.5);
    std::printf("%s\n", format_result(r).c_str());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_bench client %d (%s): %s\n", spec.index, spec.backend.c_str(),
                 e.what());
    return 1;
  }
}

}  // namespace store_bench
