// c10d's store operations on etcd keys, for the agent's etcd backend and the workers' store
// (CTRUN_STORE_BACKEND=etcd) alike. Each works on `prefix + key`; errors name `key`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/etcd/kv.h"

namespace ctrun::rendezvous::etcd {

// How long a compare-and-swap that lost `losses` times in a row waits before it tries again:
// up to 5 ms x 2^(losses - 1), at most 200 ms, drawn at random, so that many writers of one key
// spread out.
Duration contention_backoff(int losses);

// A compare-and-swap loop on the key's mod_revision, backing off after each loss. Each try also
// puts `marker` = a token of its own (on `lease`; 0 for none) in the same transaction: when a try's
// answer is lost, or a cut try landed before its retry lost, the marker tells whether it counted,
// so a retried add never counts twice. One add at a time per marker key.
Task<Result<std::int64_t>> store_add(Kv& client, std::string prefix, std::string key,
                                     std::int64_t delta, std::string marker, std::int64_t lease);

// c10d's compareSet: see StoreClient::compare_set.
Task<Result<std::string>> store_compare_set(Kv& client, std::string prefix, std::string key,
                                            std::string expected, std::string desired);

// Whether every key is set, in one read.
Task<Result<bool>> store_check(Kv& client, std::string prefix, std::vector<std::string> keys);

// Returns once every key is set (read, then a watch from the read's revision), kTimeout when
// `timeout` passes first (absent: no deadline). It ends by cancelling every watch of `client`:
// give it a client that holds no other.
Task<Status> store_wait(Kv& client, std::string prefix, std::vector<std::string> keys,
                        std::optional<Duration> timeout);

}  // namespace ctrun::rendezvous::etcd
