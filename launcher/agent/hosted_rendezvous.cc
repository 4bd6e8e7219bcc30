#include "launcher/agent/hosted_rendezvous.h"

#include <utility>

#include "rendezvous/base/log.h"
#include "rendezvous/base/open_files.h"

namespace ctrun::launcher {

rendezvous::ServerOptions hosted_rendezvous_options(const RendezvousConf& conf, std::string host,
                                                    std::uint16_t port,
                                                    std::optional<std::string> token,
                                                    std::string job) {
  rendezvous::ServerOptions options;
  options.host = std::move(host);
  options.port = port;
  rendezvous::ServiceOptions& service = options.service;
  service.token = std::move(token);
  service.log = [](const std::string& line) { rendezvous::log_line("ctrun rendezvous", line); };
  // Workers reach the job's store here as torch's TCPStore (TORCHELASTIC_USE_AGENT_STORE).
  service.worker_store_job = std::move(job);
  if (conf.max_connections) service.max_connections = *conf.max_connections;
  if (conf.max_connections_per_host) {
    service.max_connections_per_host = *conf.max_connections_per_host;
  }
  if (conf.worker_store_max_connections) {
    service.worker_store_limits.max_connections = *conf.worker_store_max_connections;
  }
  rendezvous::raise_open_file_limit();
  return options;
}

}  // namespace ctrun::launcher
