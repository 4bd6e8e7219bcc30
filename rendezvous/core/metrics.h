// What ctrund exposes for Prometheus (--metrics_port): counters kept by the Service, gauges
// read off its jobs at scrape time, and the text exposition format (version 0.0.4).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ctrun::rendezvous {

struct JobMetrics {
  std::string job;
  std::string state;  // running, succeeded, failed, closed; "store" for a job with no rendezvous
  int round = 0;
  std::size_t nodes = 0;
  std::size_t keys = 0;
  std::size_t connections = 0;
  std::int64_t restarts = 0;
  std::int64_t faults_injected = 0;  // by ctrun --faults: apart from real failures
  // The job's straggler verdict (kStragglersKey), when its agents judge step times: the
  // median seconds per step, and each straggler's rank and slowdown (x the median).
  bool steps_judged = false;
  double median_step_seconds = 0;
  std::vector<std::pair<int, double>> stragglers;       // rank, slowdown
  std::vector<std::pair<int, double>> straggler_holds;  // rank, seconds it holds each step
};

struct ServiceMetrics {
  // Counters: only ever grow while the daemon runs.
  std::map<std::string, std::uint64_t> requests;  // by op
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused = 0;
  std::uint64_t frame_errors = 0;   // connections closed for a malformed or late frame
  std::uint64_t auth_failures = 0;  // hellos with a missing or wrong token proof
  std::uint64_t rounds_formed = 0;
  std::uint64_t restarts = 0;         // added to kRestartsKey, over every job
  std::uint64_t faults_injected = 0;  // added to kFaultsInjectedKey, over every job
  // Gauges.
  std::size_t connections = 0;
  std::vector<JobMetrics> jobs;
};

std::string prometheus_text(const ServiceMetrics& m);

}  // namespace ctrun::rendezvous
