// Where a rendezvous is reached: --rdzv_endpoint's "host", "host:port", "[v6addr]" or
// "[v6addr]:port", for ctrund and for each member of an etcd endpoint list alike.
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// ctrund's port when an endpoint names none: torchrun's for a c10d rendezvous.
inline constexpr std::uint16_t kDefaultPort = 29400;

struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
};

// Leading and trailing blanks are ignored; errors are one line naming --rdzv_endpoint.
Result<Endpoint> parse_endpoint(const std::string& text, std::uint16_t default_port);
// "host:port", an IPv6 address in brackets: what parse_endpoint reads back.
std::string format_endpoint(const Endpoint& endpoint);

}  // namespace ctrun::rendezvous
