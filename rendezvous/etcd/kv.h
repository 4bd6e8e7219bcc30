// etcd's v3 key-value service as ctrun uses it: keys with revisions, transactions, leases and
// watches. The etcd backend and the etcd store are written against this; Client speaks it to a
// real etcd, and tests give an in-memory one with the same revisions, leases and watches
// (tests/rendezvous/etcd/memory_etcd.h), so that the backend's logic runs without an etcd.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/task.h"
#include "rendezvous/etcd/etcd.h"

namespace ctrun::rendezvous::etcd {

using rendezvous::Task;

class Kv {
 public:
  virtual ~Kv() = default;

  // Arguments are taken by value: a coroutine outlives the caller's temporaries. (An override
  // repeats these defaults exactly.)
  // The store's revision after the put; kNotFound when `lease` is gone.
  virtual Task<Result<std::int64_t>> put(std::string key, std::string value,
                                         std::int64_t lease = 0) = 0;
  virtual Task<Result<RangeResult>> range(std::string key, std::string range_end = "",
                                          std::int64_t limit = 0, bool keys_only = false) = 0;
  virtual Task<Result<TxnResult>> txn(Txn txn) = 0;
  // How many keys it deleted.
  virtual Task<Result<std::int64_t>> erase(std::string key, std::string range_end = "") = 0;
  // `within`, when given, bounds the call instead of the usual timeout (a connect that must end
  // by its own deadline); each failed try on the way is told to `on_retry`.
  virtual Task<Result<LeaseGrant>> grant(std::int64_t ttl_seconds,
                                         std::optional<Duration> within = {},
                                         std::function<void(const Error&)> on_retry = {}) = 0;
  // Renews the lease; the TTL left, 0 when the lease is gone (expired or revoked).
  virtual Task<Result<std::int64_t>> keep_alive(std::int64_t lease) = 0;
  // kNotFound when the lease is gone already.
  virtual Task<Status> revoke(std::int64_t lease) = 0;
  // The seconds the lease has left (-1 when it is gone) and the TTL it was granted.
  virtual Task<Result<LeaseTimeToLive>> time_to_live(std::int64_t lease) = 0;

  // Watches [key, range_end) from `start_revision` (0: from now) and hands every message to
  // `on_message` (the first says `created`) until the stream ends: an error when the connection
  // is lost or etcd cancels (kNotFound when `start_revision` was compacted: read again, then
  // watch from there), ok after cancel_watches(). `events` filters on etcd's side.
  virtual Task<Status> watch(std::string key, std::string range_end, std::int64_t start_revision,
                             std::function<void(const WatchMessage&)> on_message,
                             WatchEvents events = WatchEvents::kAll) = 0;
  // Ends every watch of this Kv.
  virtual void cancel_watches() = 0;
};

}  // namespace ctrun::rendezvous::etcd
