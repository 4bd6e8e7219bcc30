// The key-value store of one job: c10d TCPStore's operations on plain memory, plus the blocking
// side (wait/get until keys exist) as callbacks with deadlines. No sockets, no clock of its own:
// deadlines are TimePoints and expire() is told what time it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

struct StoreLimits {
  // torch's TCPStore takes keys of 8 KiB; the worker store puts the round's prefix before them.
  std::size_t max_key_bytes = (8u << 10) + 256;
  std::size_t max_value_bytes = 16u << 20;
  std::size_t max_keys = 1u << 20;
  std::size_t max_total_bytes = std::size_t{1} << 30;  // keys plus values
};

// What an `add` of `delta` leaves in `key` holding `value` (null: absent, counted as 0): an
// error for a value that is not a decimal int64, or a sum that overflows. The etcd store uses it
// too, so both stores answer alike.
Result<std::int64_t> added_value(const std::string& key, const std::string* value,
                                 std::int64_t delta);

class KeyValueStore {
 public:
  using WaiterId = std::uint64_t;
  // Runs exactly once: ok when every key exists, a kTimeout error at its deadline. It runs inside
  // the call that made the keys exist (or inside wait() when they already do) and must not
  // modify the store.
  using WaitCallback = std::function<void(Status)>;

  explicit KeyValueStore(StoreLimits limits = {});

  Status set(const std::string& key, std::string value);
  Status multi_set(const std::vector<std::string>& keys, std::vector<std::string> values);
  const std::string* find(const std::string& key) const;
  // The counter is stored as decimal text, as TCPStore does, so get() on it reads "42".
  Result<std::int64_t> add(const std::string& key, std::int64_t delta);
  // TCPStore semantics: sets `desired` when the key holds `expected` (or is absent and `expected`
  // is empty); returns the value the key holds afterwards (or `expected` when absent).
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  std::string desired);
  // c10d's append: the value grows by `data`; an absent key is created holding it.
  Status append(const std::string& key, const std::string& data);
  // True when every key exists, or names a queue that is not empty.
  bool check(const std::vector<std::string>& keys) const;
  bool erase(const std::string& key);
  // Erases every key and queue that starts with `prefix`; returns the keys erased.
  std::vector<std::string> erase_prefix(const std::string& prefix);
  std::size_t num_keys() const { return data_.size(); }
  // The keys that start with `prefix` (a scan: for the rare c10d num_keys and list_keys).
  std::vector<std::string> keys_with_prefix(const std::string& prefix) const;

  // torch 2.x TCPStore's queues: FIFO lists beside the keys (never journaled, as torch keeps
  // them in memory too). A push wakes one waiter on the queue's name.
  Status queue_push(const std::string& key, std::string value);
  struct Popped {
    std::size_t length_before = 0;
    std::optional<std::string> value;  // the front, when the queue was not empty
  };
  Popped queue_pop(const std::string& key);
  std::size_t queue_length(const std::string& key) const;
  const std::unordered_map<std::string, std::string>& entries() const { return data_; }
  std::size_t total_bytes() const { return total_bytes_; }

  // Told of every change of a key: `before` is null when the key was created, `after` when it
  // was deleted. For torch 1.13's watch_key; it must not modify the store.
  using ChangeListener = std::function<void(const std::string& key, const std::string* before,
                                            const std::string* after)>;
  void set_change_listener(ChangeListener listener) { listener_ = std::move(listener); }

  // Returns 0 when the callback already ran (all keys present).
  WaiterId wait(std::vector<std::string> keys, TimePoint deadline, WaitCallback done);
  void cancel(WaiterId id);  // drops the waiter without running its callback
  void expire(TimePoint now);
  std::optional<TimePoint> next_deadline() const;
  std::size_t num_waiters() const { return waiters_.size(); }

 private:
  struct Waiter {
    std::vector<std::string> keys;
    TimePoint deadline;
    WaitCallback done;
  };
  Status check_key(const std::string& key) const;
  Status check_put(const std::string& key, const std::string& value) const;
  void write(const std::string& key, std::string value);  // no limit checks
  Status put(const std::string& key, std::string value);
  void remove_waiter(WaiterId id);
  // Runs the waiters on `key` whose keys now all exist, at most `max_woken` of them.
  void wake_watchers(const std::string& key, std::size_t max_woken = SIZE_MAX);

  StoreLimits limits_;
  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::size_t total_bytes_ = 0;
  // Per key, its waiters in the order they came (ids grow): thousands of ranks wait on one key
  // at a barrier, so adding and removing one must not scan the others.
  std::unordered_map<std::string, std::set<WaiterId>> watchers_;
  std::map<WaiterId, Waiter> waiters_;
  std::set<std::pair<TimePoint, WaiterId>> deadlines_;
  WaiterId next_waiter_ = 1;
  ChangeListener listener_;
};

}  // namespace ctrun::rendezvous
