// Test helper: an etcd in memory. One keyspace with etcd's revisions (one per write, shared by
// every write of a transaction), transactions with its compare rules and limits, leases that
// expire by the steady clock, and watches from any past revision (history is never compacted).
// Its clients (connect()) are etcd::Kvs on one io_context; each call lets the loop run before it
// acts, as a round trip would, so that concurrent agents interleave. The same client tests run
// against it and against a real etcd (tests/rendezvous/etcd/kv_test.cc), which keeps the two
// alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/kv.h"

namespace ctrun::testing {

namespace etcd = ctrun::rendezvous::etcd;

class MemoryEtcd : public std::enable_shared_from_this<MemoryEtcd> {
 public:
  static std::shared_ptr<MemoryEtcd> create(boost::asio::io_context& io);

  // A client; of `options` only request_timeout counts (how long a call retries while this
  // etcd is stopped).
  std::unique_ptr<etcd::Kv> connect(const etcd::ClientOptions& options = {});

  // Stopped: every call fails with a connection error (retried until its timeout, as Client
  // does) and every watch ends with one. Started again: the keys are still there and, as
  // etcd's new leader does, every lease is renewed.
  void set_available(bool available);
  // Writes that landed so far (puts, deletes, successful writing transactions, expiries).
  std::int64_t revision() const { return revision_; }
  // Leases that exist now (granted, not revoked, not expired).
  std::size_t leases();

  explicit MemoryEtcd(boost::asio::io_context& io);

 private:
  class Connection;
  struct Watcher;
  struct Lease {
    std::int64_t ttl = 0;
    std::chrono::steady_clock::time_point expires;
    std::set<std::string> keys;
  };
  using Clock = std::chrono::steady_clock;

  // The operations, done at once; each returns what the wire would.
  rendezvous::Result<std::int64_t> put(const std::string& key, const std::string& value,
                                       std::int64_t lease);
  etcd::RangeResult range(const std::string& key, const std::string& range_end, std::int64_t limit,
                          bool keys_only, std::int64_t max_mod_revision = 0) const;
  rendezvous::Result<etcd::TxnResult> txn(const etcd::Txn& txn);
  std::int64_t erase(const std::string& key, const std::string& range_end);
  etcd::LeaseGrant grant(std::int64_t ttl);
  std::int64_t keep_alive(std::int64_t lease);
  rendezvous::Status revoke(std::int64_t lease);
  etcd::LeaseTimeToLive time_to_live(std::int64_t lease);

  // A write's changes share one revision, told to the watchers in one message when it ends.
  void begin_write();
  void write_put(const std::string& key, const std::string& value, std::int64_t lease);
  std::int64_t write_delete(const std::string& key, const std::string& range_end);
  void end_write();

  bool compare_holds(const etcd::Compare& c) const;
  void expire_leases();
  void arm_expiry();
  void end_watches(const Connection* owner, const rendezvous::Status& why);

  boost::asio::io_context& io_;
  bool available_ = true;
  std::map<std::string, etcd::KeyValue> keys_;
  std::int64_t revision_ = 1;  // etcd's first revision, before any write
  std::map<std::int64_t, Lease> leases_;
  std::int64_t next_lease_ = 0x6d656d00;
  // Every change ever made, for watches that start in the past.
  std::vector<etcd::WatchEvent> history_;
  std::vector<etcd::WatchEvent> writing_;  // the write in progress
  bool in_write_ = false;
  std::list<std::shared_ptr<Watcher>> watchers_;
  boost::asio::steady_timer expiry_timer_;
};

}  // namespace ctrun::testing
