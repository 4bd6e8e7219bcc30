// What a worker's c10d store talks to: the job's store on ctrund or on etcd, blocking and
// thread-safe. The c10d adapter in the worker runtime knows only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/store_address.h"

namespace ctrun::rendezvous {

class StoreClient {
 public:
  virtual ~StoreClient() = default;

  // c10d TCPStore's operations. For get/wait, `timeout` absent waits as long as the store is
  // reachable, zero does not wait, positive is a deadline.
  virtual Status set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::string> get(const std::string& key, std::optional<Duration> timeout = {}) = 0;
  virtual Result<std::int64_t> add(const std::string& key, std::int64_t delta) = 0;
  // Sets `desired` when the key holds `expected` (or is absent and `expected` is empty);
  // returns the value the key holds afterwards, or `expected` when it is absent.
  virtual Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                          const std::string& desired) = 0;
  virtual Result<bool> check(const std::vector<std::string>& keys) = 0;
  virtual Status wait(const std::vector<std::string>& keys,
                      std::optional<Duration> timeout = {}) = 0;
  virtual Result<bool> erase(const std::string& key) = 0;
  virtual Result<std::int64_t> num_keys() = 0;
};

// The store of job `job` at `address`: a connection to ctrund (retried until `timeout`), or an
// etcd client for the members listed (no call is made until the first operation; each call
// tries the members for at most min(`timeout`, 15 s)).
Result<std::unique_ptr<StoreClient>> connect_store(const StoreAddress& address,
                                                   const std::string& job, Duration timeout);

}  // namespace ctrun::rendezvous
