// Where a rendezvous is reached: --rdzv_endpoint's "host", "host:port", "[v6addr]" or
// "[v6addr]:port", for ctrund and for each member of an etcd endpoint list alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// ctrund's port when an endpoint names none: torchrun's for a c10d rendezvous.
inline constexpr std::uint16_t kDefaultPort = 29400;
// An etcd member's, in an endpoint list that names none.
inline constexpr std::uint16_t kEtcdDefaultPort = 2379;

struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
};

// Leading and trailing blanks are ignored; errors are one line naming --rdzv_endpoint.
Result<Endpoint> parse_endpoint(const std::string& text, std::uint16_t default_port);
// "host:port", an IPv6 address in brackets: what parse_endpoint reads back.
std::string format_endpoint(const Endpoint& endpoint);

// An endpoint list (etcd's members: --rdzv_endpoint, CTRUN_STORE_ADDR): endpoints in
// parse_endpoint's forms separated by commas, tried in turn; an "http://" or "https://" scheme
// is accepted (endpoint_list_https says which; one for all members).
Result<std::vector<Endpoint>> parse_endpoint_list(const std::string& text,
                                                  std::uint16_t default_port = kEtcdDefaultPort);
// Whether the members are given as https:// ones; mixing the two schemes is an error.
Result<bool> endpoint_list_https(const std::string& text);
// "h1:2379,h2:2379": what parse_endpoint_list reads back.
std::string format_endpoint_list(const std::vector<Endpoint>& endpoints);

}  // namespace ctrun::rendezvous
