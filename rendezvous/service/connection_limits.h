// ctrund's connection limits (docs/ctrund.md): ctrun's protocol against max_connections and
// max_connections_per_host; torch's TCPStore clients against their job's worker-store limit,
// fixed or following the job's ranks. It decides and counts; the service answers (an error
// frame for ctrun's clients, a close before any byte for torch's). Refusals are said at most
// once a second, with the count of those left unsaid since: a flood must not flood the log too.
// No sockets, the service's clock: tested in memory.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include "ctrun/rendezvous/clock.h"
#include "rendezvous/service/service.h"

namespace ctrun::rendezvous {

class ConnectionLimits {
 public:
  using Log = std::function<void(const std::string& line)>;

  ConnectionLimits(const ServiceOptions& options, const Clock& clock, Log log)
      : options_(options), clock_(clock), log_(std::move(log)) {}

  // A connection of ctrun's protocol from `peer` ("10.0.0.5:41608"): counted, or the answer
  // that refuses it (its reason is said).
  std::optional<std::string> admit_ctrund(const std::string& peer);
  // An admitted one closed.
  void ctrund_closed(const std::string& peer);
  std::size_t ctrund_connections() const { return ctrund_connections_; }

  // How many TCPStore connections a job's worker store takes; `ranks` (asked only when the
  // limit follows them) is how many ranks the job's rendezvous knows.
  std::size_t worker_store_limit(const std::function<std::size_t()>& ranks) const;
  // A TCPStore client from `peer` for job `job`, which has `open` of them open: true, or false
  // with the reason said.
  bool admit_tcpstore(const std::string& job, std::size_t open,
                      const std::function<std::size_t()>& ranks, const std::string& peer);

  // Says a refusal, unless one was said within the last second (then it is counted).
  void refused(const std::string& line);

 private:
  const ServiceOptions& options_;
  const Clock& clock_;
  Log log_;
  std::size_t ctrund_connections_ = 0;
  std::unordered_map<std::string, std::size_t> per_host_;  // ctrun's protocol, by host
  TimePoint last_said_{};
  std::size_t unsaid_ = 0;  // refusals since the last said, that one included
};

}  // namespace ctrun::rendezvous
