#include "rendezvous/service/connection_limits.h"

#include <algorithm>

namespace ctrun::rendezvous {

namespace {

// "10.0.0.5:41608" -> "10.0.0.5", "[::1]:41608" -> "[::1]": what a per-host limit counts.
std::string host_of(const std::string& peer) {
  const auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

std::optional<std::string> ConnectionLimits::admit_ctrund(const std::string& peer) {
  if (ctrund_connections_ >= options_.max_connections) {
    refused(peer + " refused: " + std::to_string(ctrund_connections_) +
            " connections already open (the limit: ctrund --max_connections, an agent's "
            "--rdzv_conf max_connections)");
    return "daemon is at its connection limit";
  }
  const std::string host = host_of(peer);
  std::size_t& from_host = per_host_[host];
  if (from_host >= options_.max_connections_per_host) {
    refused(peer + " refused: " + std::to_string(from_host) + " connections already open from " +
            host +
            " (the limit: ctrund --max_connections_per_host, an agent's --rdzv_conf "
            "max_connections_per_host)");
    return "too many connections from this host";
  }
  ++from_host;
  ++ctrund_connections_;
  return std::nullopt;
}

void ConnectionLimits::ctrund_closed(const std::string& peer) {
  --ctrund_connections_;
  if (auto host = per_host_.find(host_of(peer)); host != per_host_.end() && --host->second == 0) {
    per_host_.erase(host);
  }
}

std::size_t ConnectionLimits::worker_store_limit(const std::function<std::size_t()>& ranks) const {
  const WorkerStoreLimits& l = options_.worker_store_limits;
  if (l.max_connections > 0) return l.max_connections;
  return std::max(l.minimum, l.per_rank * ranks() + l.margin);
}

bool ConnectionLimits::admit_tcpstore(const std::string& job, std::size_t open,
                                      const std::function<std::size_t()>& ranks,
                                      const std::string& peer) {
  std::size_t known = 0;
  const std::size_t limit = worker_store_limit([&] { return known = ranks(); });
  if (open < limit) return true;
  const WorkerStoreLimits& l = options_.worker_store_limits;
  const std::string how =
      l.max_connections > 0 ? "as set"
                            : std::to_string(l.per_rank) + " a rank for its " +
                                  std::to_string(known) + " ranks and " + std::to_string(l.margin) +
                                  " more, at least " + std::to_string(l.minimum);
  refused(peer + " refused: job '" + job + "' has " + std::to_string(open) +
          " TCPStore connections open, its worker store's limit (" + how +
          "); raise it with ctrund --worker_store_max_connections or an agent's --rdzv_conf "
          "worker_store_max_connections");
  return false;
}

void ConnectionLimits::refused(const std::string& line) {
  const TimePoint now = clock_.now();
  if (unsaid_ > 0 && now - last_said_ < std::chrono::seconds(1)) {
    ++unsaid_;
    return;
  }
  std::string said = line;
  if (unsaid_ > 1) {
    said += " (and " + std::to_string(unsaid_ - 1) + " more refused since the last said)";
  }
  if (log_) log_(said);
  last_said_ = now;
  unsaid_ = 1;
}

}  // namespace ctrun::rendezvous
