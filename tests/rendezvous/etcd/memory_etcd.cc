#include "memory_etcd.h"

#include <boost/asio.hpp>

#include <algorithm>
#include <deque>
#include <optional>

namespace ctrun::testing {

namespace asio = boost::asio;
using rendezvous::Duration;
using rendezvous::Error;
using rendezvous::ErrorCode;
using rendezvous::ok_status;
using rendezvous::Result;
using rendezvous::Status;
template <typename T>
using Task = etcd::Task<T>;

namespace {

// etcd's own words for what it refuses, as the gateway passes them on.
Error refused(const std::string& what) {
  return Error{ErrorCode::kBadRequest, "etcd: etcdserver: " + what};
}

const std::string kAllKeys(1, '\0');  // a range_end of "\0": every key from `key` on

bool in_range(const std::string& k, const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return k == key;
  if (range_end == kAllKeys) return k >= key;
  return k >= key && k < range_end;
}

template <typename Number>
bool compare_numbers(etcd::Compare::Result result, Number have, Number want) {
  switch (result) {
    case etcd::Compare::Result::kEqual:
      return have == want;
    case etcd::Compare::Result::kGreater:
      return have > want;
    case etcd::Compare::Result::kLess:
      return have < want;
    case etcd::Compare::Result::kNotEqual:
      return have != want;
  }
  return false;
}

// What etcd checks before it runs a branch: at most 128 operations, and no key written twice
// (two puts of it, or a put inside a deleted range).
Status check_writes(const std::vector<etcd::Operation>& ops) {
  if (ops.size() > 128) return refused("too many operations in txn request");
  std::set<std::string> puts;
  for (const auto& op : ops) {
    if (op.kind != etcd::Operation::Kind::kPut) continue;
    if (!puts.insert(op.key).second) return refused("duplicate key given in txn request");
  }
  for (const auto& op : ops) {
    if (op.kind != etcd::Operation::Kind::kDelete) continue;
    for (const auto& key : puts) {
      if (in_range(key, op.key, op.range_end)) {
        return refused("duplicate key given in txn request");
      }
    }
  }
  return ok_status();
}

}  // namespace

struct MemoryEtcd::Watcher {
  explicit Watcher(asio::io_context& io) : wake(io) {}
  // Whether this watch is told of `e` (its range, and etcd's NOPUT filter when asked).
  bool hears(const etcd::WatchEvent& e) const {
    return in_range(e.kv.key, key, range_end) && (e.deleted || events == etcd::WatchEvents::kAll);
  }
  const Connection* owner = nullptr;
  std::string key;
  std::string range_end;
  etcd::WatchEvents events = etcd::WatchEvents::kAll;
  std::deque<etcd::WatchMessage> pending;
  std::optional<Status> ended;
  asio::steady_timer wake;  // cancelled when there is news
};

class MemoryEtcd::Connection final : public etcd::Kv {
 public:
  Connection(std::shared_ptr<MemoryEtcd> etcd, Duration request_timeout)
      : etcd_(std::move(etcd)), request_timeout_(request_timeout) {}
  ~Connection() override { etcd_->end_watches(this, ok_status()); }

  // Each call copies what it needs before its first co_await: the Connection may be gone when
  // the call resumes (as a Client may be).
  Task<Result<std::int64_t>> put(std::string key, std::string value,
                                 std::int64_t lease = 0) override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s.error();
    co_return etcd->put(key, value, lease);
  }
  Task<Result<etcd::RangeResult>> range(std::string key, std::string range_end = "",
                                        std::int64_t limit = 0, bool keys_only = false) override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s.error();
    co_return etcd->range(key, range_end, limit, keys_only);
  }
  Task<Result<etcd::TxnResult>> txn(etcd::Txn txn) override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s.error();
    co_return etcd->txn(txn);
  }
  Task<Result<std::int64_t>> erase(std::string key, std::string range_end = "") override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s.error();
    co_return etcd->erase(key, range_end);
  }
  Task<Result<etcd::LeaseGrant>> grant(std::int64_t ttl_seconds,
                                       std::optional<Duration> within = {},
                                       std::function<void(const Error&)> on_retry = {}) override {
    auto etcd = etcd_;
    auto s = co_await reach(etcd, within.value_or(request_timeout_), std::move(on_retry));
    if (!s) co_return s.error();
    co_return etcd->grant(ttl_seconds);
  }
  Task<Result<std::int64_t>> keep_alive(std::int64_t lease) override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s.error();
    co_return etcd->keep_alive(lease);
  }
  Task<Status> revoke(std::int64_t lease) override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s;
    co_return etcd->revoke(lease);
  }
  Task<Result<etcd::LeaseTimeToLive>> time_to_live(std::int64_t lease) override {
    auto etcd = etcd_;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s.error();
    co_return etcd->time_to_live(lease);
  }

  Task<Status> watch(std::string key, std::string range_end, std::int64_t start_revision,
                     std::function<void(const etcd::WatchMessage&)> on_message,
                     etcd::WatchEvents events = etcd::WatchEvents::kAll) override {
    auto etcd = etcd_;
    const Connection* owner = this;
    if (auto s = co_await reach(etcd, request_timeout_); !s) co_return s;
    auto w = std::make_shared<Watcher>(etcd->io_);
    w->owner = owner;
    w->key = key;
    w->range_end = range_end;
    w->events = events;
    etcd::WatchMessage created;
    created.created = true;
    created.revision = etcd->revision_;
    w->pending.push_back(created);
    if (start_revision > 0) {
      for (const auto& e : etcd->history_) {
        if (e.kv.mod_revision < start_revision || !w->hears(e)) continue;
        if (w->pending.back().revision != e.kv.mod_revision || w->pending.back().created) {
          etcd::WatchMessage m;
          m.revision = e.kv.mod_revision;
          w->pending.push_back(m);
        }
        w->pending.back().events.push_back(e);
      }
    }
    etcd->watchers_.push_back(w);
    while (!w->ended) {
      if (w->pending.empty()) {
        w->wake.expires_at(asio::steady_timer::time_point::max());
        co_await w->wake.async_wait(asio::as_tuple(asio::use_awaitable));
        continue;
      }
      etcd::WatchMessage m = std::move(w->pending.front());
      w->pending.pop_front();
      on_message(m);
    }
    etcd->watchers_.remove(w);
    co_return *w->ended;
  }

  void cancel_watches() override { etcd_->end_watches(this, ok_status()); }

 private:
  // Lets the loop run, as a round trip would; then whether etcd answers, trying again every
  // 50 ms while it is stopped, until `timeout`.
  static Task<Status> reach(std::shared_ptr<MemoryEtcd> etcd, Duration timeout,
                            std::function<void(const Error&)> on_retry = {}) {
    const auto until = Clock::now() + timeout;
    while (true) {
      co_await asio::post(etcd->io_, asio::use_awaitable);
      if (etcd->available_) {
        etcd->expire_leases();
        co_return ok_status();
      }
      Error down{ErrorCode::kConnection, "etcd: connection refused (the memory etcd is stopped)"};
      if (Clock::now() >= until) co_return down;
      if (on_retry) on_retry(down);
      asio::steady_timer pause(etcd->io_, std::chrono::milliseconds(50));
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }

  std::shared_ptr<MemoryEtcd> etcd_;
  Duration request_timeout_;
};

std::shared_ptr<MemoryEtcd> MemoryEtcd::create(asio::io_context& io) {
  return std::make_shared<MemoryEtcd>(io);
}

MemoryEtcd::MemoryEtcd(asio::io_context& io) : io_(io), expiry_timer_(io) {}

std::unique_ptr<etcd::Kv> MemoryEtcd::connect(const etcd::ClientOptions& options) {
  return std::make_unique<Connection>(shared_from_this(), options.request_timeout);
}

void MemoryEtcd::set_available(bool available) {
  available_ = available;
  if (!available) {
    end_watches(nullptr, Error{ErrorCode::kConnection,
                               "etcd: watch stream ended (the memory etcd stopped)"});
    return;
  }
  for (auto& [id, lease] : leases_) lease.expires = Clock::now() + std::chrono::seconds(lease.ttl);
  arm_expiry();
}

std::size_t MemoryEtcd::leases() {
  expire_leases();
  return leases_.size();
}

Result<std::int64_t> MemoryEtcd::put(const std::string& key, const std::string& value,
                                     std::int64_t lease) {
  if (key.empty()) return refused("key is not provided");
  if (lease != 0 && !leases_.count(lease)) {
    return Error{ErrorCode::kNotFound, "etcd: etcdserver: requested lease not found"};
  }
  begin_write();
  write_put(key, value, lease);
  end_write();
  return revision_;
}

etcd::RangeResult MemoryEtcd::range(const std::string& key, const std::string& range_end,
                                    std::int64_t limit, bool keys_only,
                                    std::int64_t max_mod_revision) const {
  etcd::RangeResult r;
  r.revision = revision_;
  for (auto it = keys_.lower_bound(key); it != keys_.end(); ++it) {
    if (!in_range(it->first, key, range_end)) break;
    ++r.count;  // as etcd 3.4: the count ignores max_mod_revision, which applies before the limit
    if (max_mod_revision > 0 && it->second.mod_revision > max_mod_revision) continue;
    if (limit > 0 && static_cast<std::int64_t>(r.kvs.size()) >= limit) {
      r.more = true;
      continue;
    }
    r.kvs.push_back(it->second);
    if (keys_only) r.kvs.back().value.clear();
  }
  return r;
}

Result<etcd::TxnResult> MemoryEtcd::txn(const etcd::Txn& txn) {
  if (txn.compare.size() > 128) return refused("too many operations in txn request");
  if (auto s = check_writes(txn.success); !s) return s.error();
  if (auto s = check_writes(txn.failure); !s) return s.error();
  for (const auto& branch : {&txn.success, &txn.failure}) {
    for (const auto& op : *branch) {
      if (op.kind == etcd::Operation::Kind::kPut && op.lease != 0 && !leases_.count(op.lease)) {
        return Error{ErrorCode::kNotFound, "etcd: etcdserver: requested lease not found"};
      }
    }
  }
  etcd::TxnResult result;
  result.succeeded = std::all_of(txn.compare.begin(), txn.compare.end(),
                                 [this](const etcd::Compare& c) { return compare_holds(c); });
  begin_write();
  // A range sees the branch's writes before it, as in etcd.
  for (const auto& op : result.succeeded ? txn.success : txn.failure) {
    switch (op.kind) {
      case etcd::Operation::Kind::kPut:
        write_put(op.key, op.value, op.lease);
        break;
      case etcd::Operation::Kind::kDelete:
        write_delete(op.key, op.range_end);
        break;
      case etcd::Operation::Kind::kRange:
        result.ranges.push_back(
            range(op.key, op.range_end, op.limit, op.keys_only, op.max_mod_revision));
        break;
    }
  }
  end_write();
  result.revision = revision_;
  for (auto& r : result.ranges) r.revision = revision_;
  return result;
}

std::int64_t MemoryEtcd::erase(const std::string& key, const std::string& range_end) {
  begin_write();
  const std::int64_t deleted = write_delete(key, range_end);
  end_write();
  return deleted;
}

etcd::LeaseGrant MemoryEtcd::grant(std::int64_t ttl) {
  const std::int64_t id = next_lease_++;
  leases_[id] = Lease{ttl, Clock::now() + std::chrono::seconds(ttl), {}};
  arm_expiry();
  return etcd::LeaseGrant{id, ttl};
}

std::int64_t MemoryEtcd::keep_alive(std::int64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return 0;
  it->second.expires = Clock::now() + std::chrono::seconds(it->second.ttl);
  arm_expiry();
  return it->second.ttl;
}

Status MemoryEtcd::revoke(std::int64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) {
    return Error{ErrorCode::kNotFound, "etcd: etcdserver: requested lease not found"};
  }
  const std::set<std::string> keys = it->second.keys;
  leases_.erase(it);
  begin_write();
  for (const auto& key : keys) write_delete(key, "");
  end_write();
  return ok_status();
}

etcd::LeaseTimeToLive MemoryEtcd::time_to_live(std::int64_t lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return etcd::LeaseTimeToLive{-1, 0};
  const auto left = std::chrono::ceil<std::chrono::seconds>(it->second.expires - Clock::now());
  return etcd::LeaseTimeToLive{std::max<std::int64_t>(0, left.count()), it->second.ttl};
}

void MemoryEtcd::begin_write() {
  in_write_ = true;
  writing_.clear();
}

void MemoryEtcd::write_put(const std::string& key, const std::string& value, std::int64_t lease) {
  const std::int64_t revision = revision_ + 1;
  etcd::KeyValue& kv = keys_[key];
  if (kv.create_revision == 0) {
    kv.key = key;
    kv.create_revision = revision;
  } else if (kv.lease != 0 && leases_.count(kv.lease)) {
    leases_[kv.lease].keys.erase(key);
  }
  kv.value = value;
  kv.mod_revision = revision;
  ++kv.version;
  kv.lease = lease;
  if (lease != 0) leases_[lease].keys.insert(key);
  writing_.push_back(etcd::WatchEvent{false, kv});
}

std::int64_t MemoryEtcd::write_delete(const std::string& key, const std::string& range_end) {
  const std::int64_t revision = revision_ + 1;
  std::int64_t deleted = 0;
  for (auto it = keys_.lower_bound(key);
       it != keys_.end() && in_range(it->first, key, range_end);) {
    if (it->second.lease != 0 && leases_.count(it->second.lease)) {
      leases_[it->second.lease].keys.erase(it->first);
    }
    etcd::KeyValue gone;
    gone.key = it->first;
    gone.mod_revision = revision;
    writing_.push_back(etcd::WatchEvent{true, gone});
    it = keys_.erase(it);
    ++deleted;
  }
  return deleted;
}

void MemoryEtcd::end_write() {
  in_write_ = false;
  if (writing_.empty()) return;
  ++revision_;
  history_.insert(history_.end(), writing_.begin(), writing_.end());
  for (const auto& w : watchers_) {
    if (w->ended) continue;
    etcd::WatchMessage m;
    m.revision = revision_;
    for (const auto& e : writing_) {
      if (w->hears(e)) m.events.push_back(e);
    }
    if (m.events.empty()) continue;
    w->pending.push_back(std::move(m));
    w->wake.cancel();
  }
  writing_.clear();
}

bool MemoryEtcd::compare_holds(const etcd::Compare& c) const {
  auto it = keys_.find(c.key);
  if (it == keys_.end() && c.target == etcd::Compare::Target::kValue) return false;
  const etcd::KeyValue none;
  const etcd::KeyValue& kv = it == keys_.end() ? none : it->second;
  switch (c.target) {
    case etcd::Compare::Target::kVersion:
      return compare_numbers(c.result, kv.version, c.number);
    case etcd::Compare::Target::kCreate:
      return compare_numbers(c.result, kv.create_revision, c.number);
    case etcd::Compare::Target::kMod:
      return compare_numbers(c.result, kv.mod_revision, c.number);
    case etcd::Compare::Target::kValue:
      return compare_numbers(c.result, kv.value, c.value);
  }
  return false;
}

// Each expired lease's keys go in one write of their own, as etcd revokes it.
void MemoryEtcd::expire_leases() {
  if (!available_ || in_write_) return;
  const auto now = Clock::now();
  std::vector<std::int64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.expires <= now) expired.push_back(id);
  }
  for (auto id : expired) (void)revoke(id);
  arm_expiry();
}

void MemoryEtcd::arm_expiry() {
  if (leases_.empty() || !available_) return;
  auto first = Clock::time_point::max();
  for (const auto& [id, lease] : leases_) first = std::min(first, lease.expires);
  expiry_timer_.expires_at(first);
  expiry_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->expire_leases();
  });
}

void MemoryEtcd::end_watches(const Connection* owner, const Status& why) {
  for (const auto& w : watchers_) {
    if (w->ended || (owner && w->owner != owner)) continue;
    w->ended = why;
    w->pending.clear();
    w->wake.cancel();
  }
}

}  // namespace ctrun::testing
