#include "rendezvous/core/store.h"

#include <algorithm>
#include <charconv>

namespace ctrun::rendezvous {

KeyValueStore::KeyValueStore(StoreLimits limits) : limits_(limits) {}

Status KeyValueStore::check_key(const std::string& key) const {
  if (key.size() > limits_.max_key_bytes) {
    return Error{ErrorCode::kLimit, "key of " + std::to_string(key.size()) +
                                        " bytes exceeds the limit of " +
                                        std::to_string(limits_.max_key_bytes)};
  }
  return ok_status();
}

Status KeyValueStore::check_put(const std::string& key, const std::string& value) const {
  if (auto s = check_key(key); !s) return s;
  if (value.size() > limits_.max_value_bytes) {
    return Error{ErrorCode::kLimit, "value of " + std::to_string(value.size()) +
                                        " bytes exceeds the limit of " +
                                        std::to_string(limits_.max_value_bytes)};
  }
  auto it = data_.find(key);
  const std::size_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
  const std::size_t new_total = total_bytes_ - old_bytes + key.size() + value.size();
  if (new_total > limits_.max_total_bytes) {
    return Error{ErrorCode::kLimit, "store would hold " + std::to_string(new_total) +
                                        " bytes, over the limit of " +
                                        std::to_string(limits_.max_total_bytes)};
  }
  if (it == data_.end() && data_.size() >= limits_.max_keys) {
    return Error{ErrorCode::kLimit,
                 "store holds the maximum of " + std::to_string(limits_.max_keys) + " keys"};
  }
  return ok_status();
}

void KeyValueStore::write(const std::string& key, std::string value) {
  auto [it, inserted] = data_.try_emplace(key);
  std::optional<std::string> before;
  if (inserted) {
    total_bytes_ += key.size();
  } else {
    total_bytes_ -= it->second.size();
    if (listener_) before = std::move(it->second);
  }
  total_bytes_ += value.size();
  it->second = std::move(value);
  if (listener_) listener_(key, before ? &*before : nullptr, &it->second);
  wake_watchers(key);
}

Status KeyValueStore::put(const std::string& key, std::string value) {
  if (auto s = check_put(key, value); !s) return s;
  write(key, std::move(value));
  return ok_status();
}

Status KeyValueStore::set(const std::string& key, std::string value) {
  return put(key, std::move(value));
}

Status KeyValueStore::multi_set(const std::vector<std::string>& keys,
                                std::vector<std::string> values) {
  if (keys.size() != values.size()) {
    return Error{ErrorCode::kBadRequest, "multi_set got " + std::to_string(keys.size()) +
                                             " keys but " + std::to_string(values.size()) +
                                             " values"};
  }
  // Validate everything first so a failing multi_set changes nothing. A key named twice counts
  // once, with its last value.
  std::unordered_map<std::string, std::size_t> last_index;  // key -> where its last value is
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (auto s = check_key(keys[i]); !s) return s;
    if (values[i].size() > limits_.max_value_bytes) {
      return Error{ErrorCode::kLimit, "value for key '" + keys[i] + "' exceeds the limit of " +
                                          std::to_string(limits_.max_value_bytes) + " bytes"};
    }
    last_index[keys[i]] = i;
  }
  std::size_t added_keys = 0;
  std::size_t new_total = total_bytes_;
  for (const auto& [key, i] : last_index) {
    const std::size_t size = values[i].size();
    auto it = data_.find(key);
    if (it == data_.end()) {
      ++added_keys;
    } else {
      new_total -= key.size() + it->second.size();
    }
    new_total += key.size() + size;
  }
  if (data_.size() + added_keys > limits_.max_keys || new_total > limits_.max_total_bytes) {
    return Error{ErrorCode::kLimit, "multi_set would exceed the store's key or byte limit"};
  }
  for (const auto& [key, i] : last_index) write(key, std::move(values[i]));  // checked above
  return ok_status();
}

const std::string* KeyValueStore::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

Result<std::int64_t> added_value(const std::string& key, const std::string* value,
                                 std::int64_t delta) {
  std::int64_t current = 0;
  if (value != nullptr) {
    const char* end = value->data() + value->size();
    auto [p, ec] = std::from_chars(value->data(), end, current);
    if (ec != std::errc() || p != end || value->empty()) {
      return Error{ErrorCode::kBadRequest,
                   "add on key '" + key + "' whose value is not an integer"};
    }
  }
  std::int64_t next = 0;
  if (__builtin_add_overflow(current, delta, &next)) {
    return Error{ErrorCode::kBadRequest, "add on key '" + key + "' overflows a 64-bit integer"};
  }
  return next;
}

Result<std::int64_t> KeyValueStore::add(const std::string& key, std::int64_t delta) {
  auto next = added_value(key, find(key), delta);
  if (!next) return next;
  if (auto s = put(key, std::to_string(next.value())); !s) return s.error();
  return next;
}

Result<std::string> KeyValueStore::compare_set(const std::string& key, const std::string& expected,
                                               std::string desired) {
  const std::string* current = find(key);
  if (current == nullptr) {
    if (!expected.empty()) return expected;
  } else if (*current != expected) {
    return *current;
  }
  std::string result = desired;
  if (auto s = put(key, std::move(desired)); !s) return s.error();
  return result;
}

Status KeyValueStore::append(const std::string& key, const std::string& data) {
  const std::string* current = find(key);
  return put(key, current ? *current + data : data);
}

bool KeyValueStore::check(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) {
    return data_.count(k) != 0 || queue_length(k) != 0;
  });
}

std::vector<std::string> KeyValueStore::keys_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const auto& [key, value] : data_) {
    if (key.compare(0, prefix.size(), prefix) == 0) out.push_back(key);
  }
  return out;
}

Status KeyValueStore::queue_push(const std::string& key, std::string value) {
  if (auto s = check_key(key); !s) return s;
  if (value.size() > limits_.max_value_bytes) {
    return Error{ErrorCode::kLimit, "value of " + std::to_string(value.size()) +
                                        " bytes exceeds the limit of " +
                                        std::to_string(limits_.max_value_bytes)};
  }
  const std::size_t new_total = total_bytes_ + key.size() + value.size();
  if (new_total > limits_.max_total_bytes) {
    return Error{ErrorCode::kLimit, "store would hold " + std::to_string(new_total) +
                                        " bytes, over the limit of " +
                                        std::to_string(limits_.max_total_bytes)};
  }
  total_bytes_ = new_total;
  queues_[key].push_back(std::move(value));
  wake_watchers(key, 1);  // one item: one popper
  return ok_status();
}

KeyValueStore::Popped KeyValueStore::queue_pop(const std::string& key) {
  Popped out;
  auto it = queues_.find(key);
  if (it == queues_.end()) return out;
  out.length_before = it->second.size();
  out.value = std::move(it->second.front());
  it->second.pop_front();
  total_bytes_ -= key.size() + out.value->size();
  if (it->second.empty()) queues_.erase(it);
  return out;
}

std::size_t KeyValueStore::queue_length(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : it->second.size();
}

bool KeyValueStore::erase(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  total_bytes_ -= key.size() + it->second.size();
  std::string before = std::move(it->second);
  data_.erase(it);
  if (listener_) listener_(key, &before, nullptr);
  return true;
}

std::vector<std::string> KeyValueStore::erase_prefix(const std::string& prefix) {
  std::vector<std::string> keys = keys_with_prefix(prefix);
  for (const auto& key : keys) erase(key);
  std::erase_if(queues_, [&prefix](const auto& q) { return q.first.starts_with(prefix); });
  return keys;
}

KeyValueStore::WaiterId KeyValueStore::wait(std::vector<std::string> keys, TimePoint deadline,
                                            WaitCallback done) {
  if (check(keys)) {
    done(ok_status());
    return 0;
  }
  const WaiterId id = next_waiter_++;
  // Watch every key, present or not: a present key may be deleted before the others appear.
  for (const auto& k : keys) watchers_[k].insert(id);
  deadlines_.emplace(deadline, id);
  waiters_.emplace(id, Waiter{std::move(keys), deadline, std::move(done)});
  return id;
}

void KeyValueStore::remove_waiter(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  for (const auto& k : it->second.keys) {
    auto w = watchers_.find(k);
    if (w == watchers_.end()) continue;
    w->second.erase(id);
    if (w->second.empty()) watchers_.erase(w);
  }
  deadlines_.erase({it->second.deadline, id});
  waiters_.erase(it);
}

void KeyValueStore::cancel(WaiterId id) { remove_waiter(id); }

void KeyValueStore::wake_watchers(const std::string& key, std::size_t max_woken) {
  auto w = watchers_.find(key);
  if (w == watchers_.end()) return;
  std::vector<WaiterId> ready;
  for (WaiterId id : w->second) {
    if (ready.size() == max_woken) break;
    if (check(waiters_.at(id).keys)) ready.push_back(id);
  }
  for (WaiterId id : ready) {
    WaitCallback done = std::move(waiters_.at(id).done);
    remove_waiter(id);
    done(ok_status());
  }
}

void KeyValueStore::expire(TimePoint now) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const WaiterId id = deadlines_.begin()->second;
    WaitCallback done = std::move(waiters_.at(id).done);
    remove_waiter(id);
    done(Error{ErrorCode::kTimeout, "timed out waiting for keys"});
  }
}

std::optional<TimePoint> KeyValueStore::next_deadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

}  // namespace ctrun::rendezvous
