// A client of etcd's v3 HTTP/JSON gateway (Boost.Beast), on the caller's io_context: unary calls
// over a small pool of kept-alive connections, tried against each endpoint in turn when one is
// down or without quorum, and watch streams on connections of their own; over TLS where asked
// (https), as an etcd user where one is given (docs/etcd_gateway.md).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/store_address.h"
#include "ctrun/rendezvous/tls.h"
#include "rendezvous/etcd/etcd.h"
#include "rendezvous/etcd/kv.h"

namespace ctrun::rendezvous::etcd {

struct ClientOptions {
  std::vector<Endpoint> endpoints;
  // A whole call, across every endpoint and retry; then the last error is returned.
  Duration request_timeout = std::chrono::seconds(15);
  // One try on one endpoint: a member that lost its leader holds a write ~7 s before it
  // answers 503, so a try is cut sooner and the next member asked.
  Duration attempt_timeout = std::chrono::seconds(4);
  // Set: every member over TLS (https), its certificate checked against tls->ca_file and its
  // host name, tls->cert_file presented when given. A certificate or file problem fails a call
  // at once, in one line.
  std::optional<TlsClientFiles> tls{};
  // Set: etcd's auth, as this user. The client asks etcd for a token (/v3/auth/authenticate),
  // sends it with every request and asks again when etcd says it is no longer valid. The
  // password is never logged nor put in an error.
  std::string user{};
  std::string password{};
};

// `options` with `access` applied: TLS, the user, and the password read from its file (the first
// line). An error names the file, never its contents.
Result<ClientOptions> with_access(ClientOptions options, const StoreAccess& access);

class Client final : public Kv {
 public:
  Client(boost::asio::io_context& io, ClientOptions options);
  ~Client() override;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // POSTs `body` to `path` ("/v3/kv/put") and returns the JSON answer. Connection errors and
  // 503s move on to the next endpoint until request_timeout; other errors come back at once.
  // A write whose try was cut (no answer in time, 503 "request timed out") may still have been
  // applied when it is sent again: callers must compare-and-swap on revisions and re-read after
  // an error, so that a retried write is never taken for a fresh one.
  Task<Result<Json>> call(std::string path, Json body);

  Task<Result<std::int64_t>> put(std::string key, std::string value,
                                 std::int64_t lease = 0) override;
  Task<Result<RangeResult>> range(std::string key, std::string range_end = "",
                                  std::int64_t limit = 0, bool keys_only = false) override;
  Task<Result<TxnResult>> txn(Txn txn) override;
  Task<Result<std::int64_t>> erase(std::string key, std::string range_end = "") override;
  Task<Result<LeaseGrant>> grant(std::int64_t ttl_seconds, std::optional<Duration> within = {},
                                 std::function<void(const Error&)> on_retry = {}) override;
  Task<Result<std::int64_t>> keep_alive(std::int64_t lease) override;
  Task<Status> revoke(std::int64_t lease) override;
  Task<Result<LeaseTimeToLive>> time_to_live(std::int64_t lease) override;
  // A stream of its own per watch, tried on each member in turn.
  Task<Status> watch(std::string key, std::string range_end, std::int64_t start_revision,
                     std::function<void(const WatchMessage&)> on_message,
                     WatchEvents events = WatchEvents::kAll) override;
  void cancel_watches() override;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous::etcd
