// Test helper: runs one coroutine on an io_context to its end, bounded, and returns its value.
#pragma once

#include <boost/asio.hpp>

#include <chrono>
#include <exception>
#include <optional>

#include "catch.h"

namespace ctrun::testing {

template <typename T>
T run_task(boost::asio::io_context& io, boost::asio::awaitable<T> task,
           std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  std::optional<T> out;
  io.restart();  // run_for() leaves it stopped once it ran out of work
  boost::asio::co_spawn(io, std::move(task), [&](std::exception_ptr e, T value) {
    if (e) std::rethrow_exception(e);
    out = std::move(value);
  });
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!out && std::chrono::steady_clock::now() < deadline) {
    io.run_for(std::chrono::milliseconds(10));
    io.restart();
  }
  REQUIRE(out.has_value());
  return std::move(*out);
}

inline void run_task(boost::asio::io_context& io, boost::asio::awaitable<void> task,
                     std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto wrapped = [](boost::asio::awaitable<void> t) -> boost::asio::awaitable<bool> {
    co_await std::move(t);
    co_return true;
  };
  run_task(io, wrapped(std::move(task)), limit);
}

}  // namespace ctrun::testing
