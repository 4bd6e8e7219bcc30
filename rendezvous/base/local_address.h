// The address of this machine that packets to a host leave from, asked of the kernel with a UDP
// socket connected to it (which sends nothing): where peers that reach that host can reach this
// machine too, with no host-name resolution. The agent's address for its peers (etcd), the
// rendezvous address a cluster launch gives its hosts, a worker's address for Gloo.
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// The numeric address (IPv4 or IPv6) towards `host`:`port`; an error saying the name did not
// resolve or no route leads there.
Result<std::string> local_address_towards(const std::string& host, std::uint16_t port);

}  // namespace ctrun::rendezvous
