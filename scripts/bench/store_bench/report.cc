#include "report.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "../common/stats.h"

namespace store_bench {
namespace {

const char* label(const std::string& backend) {
  if (backend == "ctrun") return "ctrun Client";
  if (backend == "tcpstore") return "TCPStore";
  if (backend == "ctrun_posted") return "ctrun Client, post_set";
  return "raw socket -> ctrund";
}

class Table {
 public:
  explicit Table(const Results& results) : results_(results) {}
  bool has(const std::string& backend) const { return results_.count(backend) != 0; }
  double median_of(const std::string& backend, int clients, double Measurement::*field) const {
    std::vector<double> v;
    for (const auto& m : results_.at(backend).at(clients)) v.push_back(m.*field);
    return bench::median(v);
  }

 private:
  const Results& results_;
};

}  // namespace

void print_report(const Results& results, const ReportInfo& info) {
  const Table t(results);
  if (!t.has("ctrun") || !t.has("tcpstore")) return;  // nothing to compare
  std::vector<std::string> ours = {"ctrun"};
  if (t.has("ctrun_posted")) ours.push_back("ctrun_posted");
  if (t.has("ctrun_raw")) ours.push_back("ctrun_raw");

  std::printf(
      "\nstore_bench: set+get of %d-byte values, distinct keys per client, %d ms per run, "
      "median of %d runs\n",
      info.value_bytes, info.duration_ms, info.reps);
  std::printf("\n| clients | TCPStore ops/s |");
  for (const auto& b : ours) std::printf(" %s ops/s | ratio to TCPStore |", label(b));
  std::printf("\n|--------:|---------------:|");
  for (const auto& b : ours)
    std::printf("%s:|------------------:|",
                std::string(std::string(label(b)).size() + 7, '-').c_str());
  std::printf("\n");
  for (int n : info.clients) {
    const double theirs = t.median_of("tcpstore", n, &Measurement::ops_per_s);
    std::printf("| %7d | %14.0f |", n, theirs);
    for (const auto& b : ours) {
      const double v = t.median_of(b, n, &Measurement::ops_per_s);
      std::printf(" %*.0f | %16.2fx |", static_cast<int>(std::string(label(b)).size() + 6), v,
                  v / theirs);
    }
    std::printf("\n");
  }

  const int one = info.clients.front();
  std::printf("\n| latency, %d client (us) | TCPStore |", one);
  for (const auto& b : ours) std::printf(" %s |", label(b));
  std::printf("\n|------------------------|---------:|");
  for (const auto& b : ours)
    std::printf("%s:|", std::string(std::string(label(b)).size() + 1, '-').c_str());
  std::printf("\n");
  for (auto [name, field] : {std::pair{"get median", &Measurement::get_p50_us},
                             std::pair{"get p99", &Measurement::get_p99_us},
                             std::pair{"set median", &Measurement::set_p50_us}}) {
    std::printf("| %-22s | %8.1f |", name, t.median_of("tcpstore", one, field));
    for (const auto& b : ours) {
      std::printf(" %*.1f |", static_cast<int>(std::string(label(b)).size()),
                  t.median_of(b, one, field));
    }
    std::printf("\n");
  }

  std::printf(
      "\nCPU time per op in us, clients + server (the machine has 2 cores: at saturation, "
      "throughput ~ 2e6 / total):\n\n| clients |    TCPStore |");
  for (const auto& b : ours) std::printf(" %13s |", label(b));
  std::printf("\n|--------:|------------:|");
  for (const auto& b : ours)
    std::printf(
        "%s:|",
        std::string(std::max<std::size_t>(13, std::string(label(b)).size()) + 1, '-').c_str());
  std::printf("\n");
  auto cpu = [&t](const std::string& b, int n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f + %.1f", t.median_of(b, n, &Measurement::client_cpu_us),
                  t.median_of(b, n, &Measurement::server_cpu_us));
    return std::string(buf);
  };
  for (int n : info.clients) {
    std::printf("| %7d | %11s |", n, cpu("tcpstore", n).c_str());
    for (const auto& b : ours) {
      std::printf(" %*s |",
                  static_cast<int>(std::max<std::size_t>(13, std::string(label(b)).size())),
                  cpu(b, n).c_str());
    }
    std::printf("\n");
  }

  const int most = info.clients.back();
  for (const auto& b : ours) {
    if (b == "ctrun_raw") continue;  // a diagnostic
    const double ratio = t.median_of(b, most, &Measurement::ops_per_s) /
                         t.median_of("tcpstore", most, &Measurement::ops_per_s);
    const double rtt = t.median_of(b, one, &Measurement::get_p50_us);
    std::printf(
        "\ntargets (%s): >= 2x TCPStore throughput at %d clients: %.2fx %s; "
        "median get RTT < 100 us: %.1f us %s",
        label(b), most, ratio, ratio >= 2 ? "MET" : "MISSED", rtt, rtt < 100 ? "MET" : "MISSED");
  }
  std::printf("\n");
}

}  // namespace store_bench
