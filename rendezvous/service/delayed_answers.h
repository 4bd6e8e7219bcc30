// What the service sends to its connections, held back while an injected store latency slows
// their job (ctrun --faults store_latency, kStoreLatencyKey): a slowed connection's bytes leave
// when due, in order, none ahead of bytes held before them. While no job is slowed and nothing
// is held, bytes go to the Transport at once, with no lookup. No clock of its own: the service
// passes its time, so that it is tested with a manual one.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "ctrun/rendezvous/clock.h"
#include "rendezvous/service/service.h"

namespace ctrun::rendezvous {

class DelayedAnswers {
 public:
  explicit DelayedAnswers(Transport& transport) : transport_(transport) {}

  // `bytes` for connection `id`, sent now or held; `delay()` says how late its job answers now
  // (zero: not slowed), asked only while some job may be slowed or `id` has bytes held. A
  // template: every answer passes here, and a std::function of the service's lookup would be
  // built (and allocated) for each.
  template <typename Delay>
  void send(ConnectionId id, std::string bytes, TimePoint now, const Delay& delay) {
    if (now >= slowed_until_ && !per_connection_.contains(id)) {
      transport_.send(id, std::move(bytes));  // no job is slowed now: the usual path
      return;
    }
    send_or_hold(id, std::move(bytes), now, now + delay());
  }
  // Some job answers late until `until`.
  void slowed_until(TimePoint until);
  // Sends what is due by `now`.
  void send_due(TimePoint now);
  // Sends everything held for `id` at once: it closes now, after them.
  void send_all(ConnectionId id);
  // Connection `id` is gone: what was held for it goes with it.
  void forget(ConnectionId id);
  std::size_t held() const { return held_.size(); }

 private:
  struct Held {
    TimePoint due;
    ConnectionId id = 0;
    std::string bytes;
  };
  // Sends `bytes` at once when nothing is held for `id` and they are due `now`, else holds
  // them until `due`.
  void send_or_hold(ConnectionId id, std::string bytes, TimePoint now, TimePoint due);
  // Sends and drops the held bytes `pick` chooses, oldest first.
  void send_held(const std::function<bool(const Held&)>& pick);

  Transport& transport_;
  std::deque<Held> held_;  // in the order they were sent
  // Per connection: how many of its bytes are held, and the due time of the last (later ones
  // wait for it).
  std::unordered_map<ConnectionId, std::pair<std::size_t, TimePoint>> per_connection_;
  TimePoint slowed_until_{};  // the latest end of any job's latency
};

}  // namespace ctrun::rendezvous
