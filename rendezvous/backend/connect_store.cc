// connect_store, and the etcd side of StoreClient: etcd_store.h's coroutines run to their end,
// one call at a time, on a private io_context in the calling thread.
#include "ctrun/rendezvous/store_client.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <exception>
#include <mutex>

#include "ctrun/rendezvous/client.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/protocol/auth.h"

namespace ctrun::rendezvous {
namespace {

class EtcdStoreClient final : public StoreClient {
 public:
  EtcdStoreClient(etcd::ClientOptions options, const std::string& job)
      : client_(io_, std::move(options)),
        prefix_(etcd_job_prefix(job) + "store/"),
        // This client's add marker: one key, overwritten by each add (etcd_store.h); it goes
        // when the job's keys are wiped for a new job under the same id.
        marker_(etcd_job_prefix(job) + "ops/worker-" + random_hex(8)) {}

  Status set(const std::string& key, const std::string& value) override {
    auto put = run(client_.put(prefix_ + key, value));
    return put ? ok_status() : Status(put.error());
  }

  Result<std::string> get(const std::string& key, std::optional<Duration> timeout) override {
    auto waited = run(etcd::store_wait(client_, prefix_, {key}, timeout));
    if (!waited) return waited.error();
    auto found = run(client_.range(prefix_ + key));
    if (!found) return found.error();
    // Set, then deleted before this read: as good as never set.
    if (found.value().kvs.empty())
      return Error{ErrorCode::kNotFound, "key '" + key + "' is not set"};
    return found.value().kvs.front().value;
  }

  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    return run(etcd::store_add(client_, prefix_, key, delta, marker_, 0));
  }

  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override {
    return run(etcd::store_compare_set(client_, prefix_, key, expected, desired));
  }

  Result<bool> check(const std::vector<std::string>& keys) override {
    return run(etcd::store_check(client_, prefix_, keys));
  }

  Status wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) override {
    return run(etcd::store_wait(client_, prefix_, keys, timeout));
  }

  Result<bool> erase(const std::string& key) override {
    auto erased = run(client_.erase(prefix_ + key));
    if (!erased) return erased.error();
    return erased.value() > 0;
  }

  Result<std::int64_t> num_keys() override {
    auto found = run(client_.range(prefix_, etcd::prefix_end(prefix_), 1));
    if (!found) return found.error();
    return found.value().count;
  }

 private:
  template <typename T>
  T run(etcd::Task<T> task) {
    std::lock_guard lock(mutex_);
    std::optional<T> out;
    std::exception_ptr error;
    boost::asio::co_spawn(io_, std::move(task), [&](std::exception_ptr e, T value) {
      if (e)
        error = e;
      else
        out = std::move(value);
    });
    io_.restart();
    while (!out && !error) {
      if (io_.run_one() == 0) break;
    }
    if (error) std::rethrow_exception(error);
    if (!out) return T(Error{ErrorCode::kInternal, "etcd store: a call ended without an answer"});
    return std::move(*out);
  }

  std::mutex mutex_;  // one call at a time on io_
  boost::asio::io_context io_;
  etcd::Client client_;
  const std::string prefix_;
  const std::string marker_;
};

}  // namespace

Result<std::unique_ptr<StoreClient>> connect_store(const StoreAddress& address,
                                                   const std::string& job, Duration timeout) {
  if (address.backend == StoreAddress::Backend::kEtcd) {
    if (address.etcd_endpoints.empty()) {
      return Error{ErrorCode::kBadRequest, "etcd store: no endpoint given"};
    }
    etcd::ClientOptions options;
    options.endpoints = address.etcd_endpoints;
    // A call keeps trying the members (one restarting, a leader election) this long.
    options.request_timeout = std::min(options.request_timeout, timeout);
    return std::unique_ptr<StoreClient>(std::make_unique<EtcdStoreClient>(options, job));
  }
  ClientOptions options;
  options.host = address.host;
  options.port = static_cast<std::uint16_t>(address.port);
  options.job = job;
  options.token = address.token;
  options.connect_timeout = timeout;
  auto client = Client::connect(options);
  if (!client) return client.error();
  return std::unique_ptr<StoreClient>(std::move(client).value());
}

}  // namespace ctrun::rendezvous
