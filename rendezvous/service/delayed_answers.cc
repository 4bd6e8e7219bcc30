#include "rendezvous/service/delayed_answers.h"

#include <algorithm>

namespace ctrun::rendezvous {

void DelayedAnswers::send_or_hold(ConnectionId id, std::string bytes, TimePoint now,
                                  TimePoint due) {
  if (due == now && !per_connection_.contains(id)) {
    transport_.send(id, std::move(bytes));
    return;
  }
  auto& [count, last_due] = per_connection_[id];
  due = std::max(due, last_due);  // never ahead of what the connection was sent before
  last_due = due;
  ++count;
  held_.push_back({due, id, std::move(bytes)});
}

void DelayedAnswers::slowed_until(TimePoint until) {
  slowed_until_ = std::max(slowed_until_, until);
}

void DelayedAnswers::send_due(TimePoint now) {
  if (held_.empty()) return;
  send_held([now](const Held& h) { return h.due <= now; });
}

void DelayedAnswers::send_all(ConnectionId id) {
  if (per_connection_.count(id) == 0) return;
  send_held([id](const Held& h) { return h.id == id; });
}

void DelayedAnswers::forget(ConnectionId id) {
  if (per_connection_.erase(id) != 0) {
    std::erase_if(held_, [id](const Held& h) { return h.id == id; });
  }
}

void DelayedAnswers::send_held(const std::function<bool(const Held&)>& pick) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (!pick(*it)) {
      ++it;
      continue;
    }
    auto count = per_connection_.find(it->id);
    if (count != per_connection_.end() && --count->second.first == 0) per_connection_.erase(count);
    transport_.send(it->id, std::move(it->bytes));
    it = held_.erase(it);
  }
}

}  // namespace ctrun::rendezvous
