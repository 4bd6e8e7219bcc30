// The coroutine type of every asynchronous call of the rendezvous side (AsyncClient, the
// agent's Backend): an Asio awaitable on the caller's io_context.
#pragma once

#include <boost/asio/awaitable.hpp>

namespace ctrun::rendezvous {

template <typename T>
using Task = boost::asio::awaitable<T>;

}  // namespace ctrun::rendezvous
