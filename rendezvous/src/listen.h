// Opening a listening TCP socket the way every ctrun server does: an empty host means every
// interface (IPv6 with IPv4 mapped, else IPv4), a name is resolved and each address tried.
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// On success `acceptor` listens; read the bound port from its local_endpoint().
Status listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host,
                 std::uint16_t port);

// "127.0.0.1:29400" or "[::1]:29400".
std::string endpoint_text(const boost::asio::ip::tcp::endpoint& ep);

}  // namespace ctrun::rendezvous
