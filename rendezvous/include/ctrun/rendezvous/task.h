// The coroutine type of every asynchronous call of the rendezvous side (AsyncClient, the
// agent's Backend): an Asio awaitable on the caller's io_context.
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "ctrun/rendezvous/clock.h"

namespace ctrun::rendezvous {

template <typename T>
using Task = boost::asio::awaitable<T>;

// A pause of the calling coroutine on its own executor; the rest of the loop runs meanwhile.
inline Task<void> sleep_for(Duration d) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor, d);
  co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
}

}  // namespace ctrun::rendezvous
