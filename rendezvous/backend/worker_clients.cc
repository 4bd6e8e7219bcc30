// What a worker reaches its job with: connect_store (the c10d store) and connect_quorum (the
// per-step quorum), on ctrund (its blocking Client) or on etcd (coroutines run to their end,
// one call at a time, on a private io_context in the calling thread).
#include "ctrun/rendezvous/quorum_client.h"
#include "ctrun/rendezvous/store_client.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <exception>
#include <mutex>

#include "ctrun/rendezvous/client.h"
#include "rendezvous/base/random.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/etcd_quorum.h"
#include "rendezvous/etcd/etcd_store.h"

namespace ctrun::rendezvous {
namespace {

// Runs coroutines to their end on a private io_context in the calling thread, one at a time.
class BlockingIo {
 public:
  boost::asio::io_context& context() { return io_; }

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
    if (!out) return T(Error{ErrorCode::kInternal, "etcd: a call ended without an answer"});
    return std::move(*out);
  }

 private:
  std::mutex mutex_;  // one call at a time on io_
  boost::asio::io_context io_;
};

// An etcd client for a worker: its calls try the members for at most min(`timeout`, 15 s).
Result<etcd::ClientOptions> worker_etcd_options(const StoreAddress& address, Duration timeout) {
  etcd::ClientOptions options;
  options.endpoints = address.etcd_endpoints;
  // A call keeps trying the members (one restarting, a leader election) this long.
  options.request_timeout = std::min(options.request_timeout, timeout);
  return etcd::with_access(std::move(options), address.access);
}

ClientOptions ctrund_options(const StoreAddress& address, const std::string& job,
                             Duration timeout) {
  ClientOptions options;
  options.host = address.host;
  options.port = static_cast<std::uint16_t>(address.port);
  options.job = job;
  options.token = address.token;
  options.tls = address.access.tls;
  options.connect_timeout = timeout;
  return options;
}

class EtcdStoreClient final : public StoreClient {
 public:
  EtcdStoreClient(etcd::ClientOptions options, const std::string& job)
      : client_(io_.context(), std::move(options)),
        prefix_(etcd_job_prefix(job) + "store/"),
        // This client's add marker: one key, overwritten by each add (etcd_store.h); it goes
        // when the job's keys are wiped for a new job under the same id.
        marker_(etcd_job_prefix(job) + "ops/worker-" + random_hex(8)) {}

  Status set(const std::string& key, const std::string& value) override {
    auto put = io_.run(client_.put(prefix_ + key, value));
    return put ? ok_status() : Status(put.error());
  }

  Result<std::string> get(const std::string& key, std::optional<Duration> timeout) override {
    auto waited = io_.run(etcd::store_wait(client_, prefix_, {key}, timeout));
    if (!waited) return waited.error();
    auto found = io_.run(client_.range(prefix_ + key));
    if (!found) return found.error();
    // Set, then deleted before this read: as good as never set.
    if (found.value().kvs.empty())
      return Error{ErrorCode::kNotFound, "key '" + key + "' is not set"};
    return found.value().kvs.front().value;
  }

  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override {
    return io_.run(etcd::store_add(client_, prefix_, key, delta, marker_, 0));
  }

  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override {
    return io_.run(etcd::store_compare_set(client_, prefix_, key, expected, desired));
  }

  Result<bool> check(const std::vector<std::string>& keys) override {
    return io_.run(etcd::store_check(client_, prefix_, keys));
  }

  Status wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) override {
    return io_.run(etcd::store_wait(client_, prefix_, keys, timeout));
  }

  Result<bool> erase(const std::string& key) override {
    auto erased = io_.run(client_.erase(prefix_ + key));
    if (!erased) return erased.error();
    return erased.value() > 0;
  }

  Result<std::int64_t> num_keys() override {
    auto found = io_.run(client_.range(prefix_, etcd::prefix_end(prefix_), 1));
    if (!found) return found.error();
    return found.value().count;
  }

 private:
  BlockingIo io_;
  etcd::Client client_;
  const std::string prefix_;
  const std::string marker_;
};

class EtcdQuorumClient final : public QuorumClient {
 public:
  EtcdQuorumClient(etcd::ClientOptions options, const std::string& job,
                   const std::string& replica_id)
      : client_(io_.context(), std::move(options)), quorum_(client_, job, replica_id, clock_) {}
  // A replica that goes without finishing (an error, its quorum given up) is let go at once,
  // not when its lease expires, unless etcd was unreachable just now.
  ~EtcdQuorumClient() override {
    if (!reachable_) return;
    try {
      (void)io_.run(quorum_.leave());  // best effort: else the lease expires
    } catch (...) {
    }
  }

  Result<QuorumAssignment> quorum(const QuorumRequest& request,
                                  std::optional<Duration> timeout) override {
    auto answer = io_.run(quorum_.ask(request, timeout.value_or(std::chrono::hours(24 * 365))));
    reachable_ = answer || answer.error().code != ErrorCode::kConnection;
    return answer;
  }

  // (Bounded by the client's request timeout: an etcd call cannot be cut shorter here.)
  Status quorum_heartbeat(const std::string&, Duration) override {
    auto beat = io_.run(quorum_.heartbeat());
    reachable_ = beat || beat.error().code != ErrorCode::kConnection;
    return beat;
  }

 private:
  BlockingIo io_;
  SteadyClock clock_;
  etcd::Client client_;
  EtcdQuorum quorum_;
  bool reachable_ = true;
};

}  // namespace

Result<std::unique_ptr<StoreClient>> connect_store(const StoreAddress& address,
                                                   const std::string& job, Duration timeout) {
  if (address.backend == StoreAddress::Backend::kEtcd) {
    if (address.etcd_endpoints.empty()) {
      return Error{ErrorCode::kBadRequest, "etcd store: no endpoint given"};
    }
    auto options = worker_etcd_options(address, timeout);
    if (!options) return options.error();
    return std::unique_ptr<StoreClient>(
        std::make_unique<EtcdStoreClient>(std::move(options).value(), job));
  }
  auto client = Client::connect(ctrund_options(address, job, timeout));
  if (!client) return client.error();
  return std::unique_ptr<StoreClient>(std::move(client).value());
}

Result<std::unique_ptr<QuorumClient>> connect_quorum(const StoreAddress& address,
                                                     const std::string& job,
                                                     const std::string& replica_id,
                                                     Duration timeout) {
  if (address.backend == StoreAddress::Backend::kEtcd) {
    if (address.etcd_endpoints.empty()) {
      return Error{ErrorCode::kBadRequest, "etcd quorum: no endpoint given"};
    }
    auto options = worker_etcd_options(address, timeout);
    if (!options) return options.error();
    return std::unique_ptr<QuorumClient>(
        std::make_unique<EtcdQuorumClient>(std::move(options).value(), job, replica_id));
  }
  auto client = Client::connect(ctrund_options(address, job, timeout));
  if (!client) return client.error();
  return std::unique_ptr<QuorumClient>(std::move(client).value());
}

}  // namespace ctrun::rendezvous
