// The rendezvous a ctrun hosts (an agent's, for --standalone or as the endpoint's host; or
// ctrun --hostfile's for its hosts): ctrund's service with the job's store also served to
// torch's TCPStore clients on its port, and the limits --rdzv_conf sets.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ctrun/launcher/options.h"
#include "rendezvous/daemon/server.h"

namespace ctrun::launcher {

// Raises this process's open-file limit to the hard one (each rank of the job holds a
// descriptor of the store; workers get the user's limit back).
rendezvous::ServerOptions hosted_rendezvous_options(const RendezvousConf& conf, std::string host,
                                                    std::uint16_t port,
                                                    std::optional<std::string> token,
                                                    std::string job);

}  // namespace ctrun::launcher
