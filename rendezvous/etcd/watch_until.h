// Waiting on etcd keys with a deadline: a watch that ends when its caller has seen what it
// waited for, or when the deadline passes. The store's waits and the quorum's use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "rendezvous/etcd/kv.h"

namespace ctrun::rendezvous::etcd {

// Watches [key, range_end) from `start_revision` and hands each message to `done` until it
// returns true (then ok). kTimeout once `deadline` passes (time_point::max(): none); the
// stream's error when it breaks (a member restarting, the revision compacted: read again, then
// watch again). It ends by cancelling every watch of `client`: give it a client that holds no
// other.
Task<Status> watch_until(Kv& client, std::string key, std::string range_end,
                         std::int64_t start_revision,
                         std::chrono::steady_clock::time_point deadline,
                         std::function<bool(const WatchMessage&)> done);

}  // namespace ctrun::rendezvous::etcd
