#include "rendezvous/etcd/watch_until.h"

#include <memory>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>

namespace ctrun::rendezvous::etcd {
namespace asio = boost::asio;
namespace {

using SteadyClock = std::chrono::steady_clock;

// Cancels the watch once `deadline` passes, again every 100 ms until the watch has ended: a
// cancel that came while the watch was still connecting finds nothing to close.
struct WatchDeadline {
  explicit WatchDeadline(asio::any_io_executor executor) : timer(std::move(executor)) {}
  asio::steady_timer timer;
  bool watch_ended = false;
  bool passed = false;
};

void arm(const std::shared_ptr<WatchDeadline>& d, Kv& client, SteadyClock::time_point when) {
  d->timer.expires_at(when);
  d->timer.async_wait([d, &client](boost::system::error_code ec) {
    if (ec || d->watch_ended) return;
    d->passed = true;
    client.cancel_watches();
    arm(d, client, SteadyClock::now() + std::chrono::milliseconds(100));
  });
}

}  // namespace

Task<Status> watch_until(Kv& client, std::string key, std::string range_end,
                         std::int64_t start_revision, SteadyClock::time_point deadline,
                         std::function<bool(const WatchMessage&)> done) {
  auto watch_deadline = std::make_shared<WatchDeadline>(co_await asio::this_coro::executor);
  if (deadline != SteadyClock::time_point::max()) arm(watch_deadline, client, deadline);
  bool seen = false;
  std::function<void(const WatchMessage&)> on_message = [&](const WatchMessage& m) {
    if (seen || !done(m)) return;
    seen = true;
    client.cancel_watches();
  };
  auto watched = co_await client.watch(std::move(key), std::move(range_end), start_revision,
                                       std::move(on_message));
  watch_deadline->watch_ended = true;
  watch_deadline->timer.cancel();
  if (seen) co_return ok_status();
  if (watch_deadline->passed) co_return Error{ErrorCode::kTimeout, "etcd: the wait timed out"};
  if (!watched) co_return watched.error();
  co_return Error{ErrorCode::kConnection, "etcd: the watch ended"};
}

}  // namespace ctrun::rendezvous::etcd
