// A client of etcd's v3 HTTP/JSON gateway (Boost.Beast), on the caller's io_context: unary calls
// over a small pool of kept-alive connections, tried against each endpoint in turn when one is
// down or without quorum, and watch streams on connections of their own. TLS and auth are not
// supported yet (docs/cluster.md).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "ctrun/rendezvous/clock.h"
#include "rendezvous/etcd/etcd.h"

namespace ctrun::rendezvous::etcd {

template <typename T>
using Task = boost::asio::awaitable<T>;

struct ClientOptions {
  std::vector<Endpoint> endpoints;
  // A whole call, across every endpoint and retry; then the last error is returned.
  Duration request_timeout = std::chrono::seconds(15);
  // One try on one endpoint: a member that lost its leader holds a write ~7 s before it
  // answers 503, so a try is cut sooner and the next member asked.
  Duration attempt_timeout = std::chrono::seconds(4);
};

class Client {
 public:
  Client(boost::asio::io_context& io, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Arguments are taken by value: a coroutine outlives the caller's temporaries.
  // POSTs `body` to `path` ("/v3/kv/put") and returns the JSON answer. Connection errors and
  // 503s move on to the next endpoint until request_timeout; other errors come back at once.
  // A write whose try was cut (no answer in time, 503 "request timed out") may still have been
  // applied when it is sent again: callers must compare-and-swap on revisions and re-read after
  // an error, so that a retried write is never taken for a fresh one.
  Task<Result<Json>> call(std::string path, Json body);

  Task<Result<std::int64_t>> put(std::string key, std::string value,
                                 std::int64_t lease = 0);  // the new revision
  Task<Result<RangeResult>> range(std::string key, std::string range_end = "",
                                  std::int64_t limit = 0, bool keys_only = false);
  Task<Result<TxnResult>> txn(Txn txn);
  Task<Result<std::int64_t>> erase(std::string key, std::string range_end = "");
  // `within`, when given, bounds the call instead of request_timeout (a connect that must end
  // by its own deadline); each failed try on the way is told to `on_retry`.
  Task<Result<LeaseGrant>> grant(std::int64_t ttl_seconds, std::optional<Duration> within = {},
                                 std::function<void(const Error&)> on_retry = {});
  // Renews the lease; the TTL left, 0 when the lease is gone (expired or revoked).
  Task<Result<std::int64_t>> keep_alive(std::int64_t lease);
  Task<Status> revoke(std::int64_t lease);

  // Watches [key, range_end) from `start_revision` (0: from now) and hands every message to
  // `on_message` until the stream ends: an error when the connection is lost or etcd cancels
  // (kNotFound when `start_revision` was compacted: read again, then watch from there), ok after
  // cancel_watches() or the Client's end.
  Task<Status> watch(std::string key, std::string range_end, std::int64_t start_revision,
                     std::function<void(const WatchMessage&)> on_message);
  void cancel_watches();

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous::etcd
