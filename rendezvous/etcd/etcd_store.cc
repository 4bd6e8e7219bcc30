#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include "rendezvous/base/random.h"
#include "rendezvous/core/store.h"
#include "rendezvous/etcd/watch_until.h"

namespace ctrun::rendezvous::etcd {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The longest prefix all `keys` share: one watch covers them.
std::string common_prefix(const std::set<std::string>& keys) {
  std::string shared = *keys.begin();
  for (const auto& k : keys) {
    const auto end = std::mismatch(shared.begin(), shared.end(), k.begin(), k.end()).first;
    shared.erase(end, shared.end());
  }
  return shared;
}

// Reads which of `keys` are set: one range per key, in order, in transactions of at most
// etcd's default 128 operations. The revision is the first read's: a watch from there misses
// nothing.
Task<Result<TxnResult>> read_keys(Kv& client, std::set<std::string> keys) {
  constexpr std::size_t kOpsPerTxn = 128;
  TxnResult all;
  for (auto it = keys.begin(); it != keys.end();) {
    Txn txn;
    for (; it != keys.end() && txn.success.size() < kOpsPerTxn; ++it) {
      txn.success.push_back(range_op(*it));
    }
    auto read = co_await client.txn(std::move(txn));
    if (!read) co_return read.error();
    if (all.revision == 0) all.revision = read.value().revision;
    for (auto& r : read.value().ranges) all.ranges.push_back(std::move(r));
  }
  all.succeeded = true;
  co_return all;
}

}  // namespace

Duration contention_backoff(int losses) {
  static thread_local std::minstd_rand random(std::random_device{}());
  const auto most_ms = std::min<std::int64_t>(5LL << std::min(losses - 1, 6), 200);
  return std::chrono::microseconds(random() % (most_ms * 1000 + 1));
}

Task<Result<std::int64_t>> store_add(Kv& client, std::string prefix, std::string key,
                                     std::int64_t delta, std::string marker, std::int64_t lease) {
  const std::string full = prefix + key;
  auto found = co_await client.range(full);
  if (!found) co_return found.error();
  std::optional<KeyValue> current;
  if (!found.value().kvs.empty()) current = found.value().kvs.front();
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const std::string token = random_hex(8);
    auto next = added_value(key, current ? &current->value : nullptr, delta);
    if (!next) co_return next.error();
    Txn txn;
    txn.compare.push_back(unchanged_since(full, current ? current->mod_revision : 0));
    txn.success.push_back(put_op(full, std::to_string(next.value())));
    txn.success.push_back(put_op(marker, token, lease));
    txn.failure.push_back(range_op(full));  // a lost try learns the value it lost to
    auto done = co_await client.txn(std::move(txn));
    if (done && done.value().succeeded) co_return next.value();
    // Lost, or no answer: the marker tells whether a try of this one landed after all. Until
    // it is known, no new try: it would add on top of one that may have counted.
    auto landed = co_await client.range(marker);
    if (!landed) co_return landed.error();
    if (!landed.value().kvs.empty() && landed.value().kvs.front().value == token) {
      co_return next.value();
    }
    if (!done) co_return done.error();
    const auto& ranges = done.value().ranges;
    current.reset();
    if (!ranges.empty() && !ranges.front().kvs.empty()) current = ranges.front().kvs.front();
    // Many adders on one key (a barrier's counter): back off at random, more with each loss.
    co_await sleep_for(contention_backoff(attempt + 1));
  }
  co_return Error{ErrorCode::kConflict, "key '" + key + "': too many concurrent writers"};
}

Task<Result<std::string>> store_compare_set(Kv& client, std::string prefix, std::string key,
                                            std::string expected, std::string desired) {
  const std::string full = prefix + key;
  // An empty `expected` matches an absent key and an empty value: etcd compares one of them at
  // a time (a value compare on an absent key is false), so an empty value takes a second try.
  std::string current;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Txn txn;
    if (expected.empty() && attempt == 0) {
      txn.compare.push_back(unchanged_since(full, 0));
    } else {
      txn.compare.push_back(
          Compare{full, Compare::Target::kValue, Compare::Result::kEqual, 0, expected});
    }
    txn.success.push_back(put_op(full, desired));
    txn.failure.push_back(range_op(full));
    // A retried try that had landed finds `desired` there and answers it: the same answer.
    auto done = co_await client.txn(std::move(txn));
    if (!done) co_return done.error();
    if (done.value().succeeded) co_return desired;
    const auto& ranges = done.value().ranges;
    if (ranges.empty() || ranges.front().kvs.empty()) {
      if (!expected.empty()) co_return expected;
      continue;  // deleted since the first try's compare
    }
    current = ranges.front().kvs.front().value;
    if (!expected.empty() || !current.empty()) co_return current;
  }
  co_return current;
}

Task<Result<bool>> store_check(Kv& client, std::string prefix, std::vector<std::string> keys) {
  std::set<std::string> full;
  for (const auto& k : keys) full.insert(prefix + k);
  if (full.empty()) co_return true;
  auto read = co_await read_keys(client, full);
  if (!read) co_return read.error();
  for (const auto& r : read.value().ranges) {
    if (r.kvs.empty()) co_return false;
  }
  co_return true;
}

Task<Status> store_wait(Kv& client, std::string prefix, std::vector<std::string> keys,
                        std::optional<Duration> timeout) {
  const auto deadline = timeout ? SteadyClock::now() + *timeout : SteadyClock::time_point::max();
  std::set<std::string> missing;
  for (const auto& k : keys) missing.insert(prefix + k);
  while (!missing.empty()) {
    auto read = co_await read_keys(client, missing);
    if (!read) co_return read.error();
    if (read.value().ranges.size() != missing.size()) {
      co_return Error{ErrorCode::kInternal, "etcd: a read of " + std::to_string(missing.size()) +
                                                " keys answered " +
                                                std::to_string(read.value().ranges.size())};
    }
    auto range = read.value().ranges.begin();
    for (auto it = missing.begin(); it != missing.end(); ++range) {
      it = range->kvs.empty() ? std::next(it) : missing.erase(it);
    }
    if (missing.empty()) break;
    if (SteadyClock::now() >= deadline) {
      co_return Error{
          timeout && *timeout == Duration::zero() ? ErrorCode::kNotFound : ErrorCode::kTimeout,
          "key '" + missing.begin()->substr(prefix.size()) + "' is not set" +
              (timeout ? " after " + std::to_string(to_millis(*timeout)) + " ms" : std::string())};
    }
    const std::string shared = common_prefix(missing);
    auto watched =
        co_await watch_until(client, shared, prefix_end(shared), read.value().revision + 1,
                             deadline, [&](const WatchMessage& m) {
                               for (const auto& event : m.events) {
                                 if (!event.deleted) missing.erase(event.kv.key);
                               }
                               return missing.empty();
                             });
    if (!watched && watched.error().code != ErrorCode::kTimeout) {
      // The stream broke (a member restarting, the revision compacted): read again, watch
      // again, after a pause so that a member that is down is not hammered.
      co_await sleep_for(std::chrono::milliseconds(200));
    }
  }
  co_return ok_status();
}

}  // namespace ctrun::rendezvous::etcd
