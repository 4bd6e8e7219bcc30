// What ctrund exposes for Prometheus (--metrics_port): counters kept by the Service, gauges
#include "rendezvous/protocol/fault_keys.h"
// read off its jobs at scrape time, and the text exposition format (version 0.0.4).
#include "rendezvous/protocol/fault_keys.h"
#pragma once
#include "rendezvous/protocol/fault_keys.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include "rendezvous/protocol/fault_keys.h"

#include "rendezvous/protocol/fault_keys.h"
namespace ctrun::rendezvous {
#include "rendezvous/protocol/fault_keys.h"

#include "rendezvous/protocol/fault_keys.h"
struct JobMetrics {
#include "rendezvous/protocol/fault_keys.h"
  std::string job;
#include "rendezvous/protocol/fault_keys.h"
  std::string state;  // running, succeeded, failed, closed; "store" for a job with no rendezvous
#include "rendezvous/protocol/fault_keys.h"
  int round = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::size_t nodes = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::size_t keys = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::size_t connections = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::int64_t restarts = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::int64_t faults_injected = 0;  // by ctrun --faults: apart from real failures
#include "rendezvous/protocol/fault_keys.h"
};
#include "rendezvous/protocol/fault_keys.h"

#include "rendezvous/protocol/fault_keys.h"
struct ServiceMetrics {
#include "rendezvous/protocol/fault_keys.h"
  // Counters: only ever grow while the daemon runs.
#include "rendezvous/protocol/fault_keys.h"
  std::map<std::string, std::uint64_t> requests;  // by op
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t connections_accepted = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t connections_refused = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t frame_errors = 0;  // connections closed for a malformed or late frame
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t auth_failures = 0;  // hellos with a missing or wrong token proof
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t rounds_formed = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t restarts = 0;  // added to kRestartsKey, over every job
#include "rendezvous/protocol/fault_keys.h"
  std::uint64_t faults_injected = 0;  // added to kFaultsInjectedKey, over every job
#include "rendezvous/protocol/fault_keys.h"
  // Gauges.
#include "rendezvous/protocol/fault_keys.h"
  std::size_t connections = 0;
#include "rendezvous/protocol/fault_keys.h"
  std::vector<JobMetrics> jobs;
#include "rendezvous/protocol/fault_keys.h"
};
#include "rendezvous/protocol/fault_keys.h"

#include "rendezvous/protocol/fault_keys.h"
std::string prometheus_text(const ServiceMetrics& m);
#include "rendezvous/protocol/fault_keys.h"

#include "rendezvous/protocol/fault_keys.h"
}  // namespace ctrun::rendezvous
#include "rendezvous/protocol/fault_keys.h"
