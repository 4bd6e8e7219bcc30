// Opening a listening TCP socket the way every ctrun server does: an empty host means every
// interface (IPv6 with IPv4 mapped, else IPv4), a name is resolved and each address tried.
#pragma once

#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// On success `acceptor` listens; read the bound port from its local_endpoint().
Status listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host,
                 std::uint16_t port);

// Accepts connection after connection, handing each to `on_accept`. After an error (out of
// descriptors) it waits 100 ms, telling `on_error`, instead of spinning on the event loop. Every
// handler first asks `keep_going()`, which must be safe to call after the owner is gone (a weak
// pointer), and stops the loop when it says false.
void accept_loop(boost::asio::ip::tcp::acceptor& acceptor, std::function<bool()> keep_going,
                 std::function<void(boost::asio::ip::tcp::socket)> on_accept,
                 std::function<void(const std::string&)> on_error);

// "127.0.0.1:29400" or "[::1]:29400".
std::string endpoint_text(const boost::asio::ip::tcp::endpoint& ep);

}  // namespace ctrun::rendezvous
