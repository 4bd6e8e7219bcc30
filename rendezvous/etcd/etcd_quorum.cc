#include "rendezvous/etcd/etcd_quorum.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "rendezvous/base/random.h"
#include "rendezvous/core/quorum.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/etcd/watch_until.h"

namespace ctrun::rendezvous {
namespace {

// What a saved state decides, without the times it was saved at: two states that differ only
// there need no write.
Json decisions(Json saved) {
  saved.erase("saved_unix_ms");
  if (saved.contains("first_ask_age_ms")) saved["first_ask_age_ms"] = 0;
  return saved;
}

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The state and who is alive, read at one revision.
struct Snapshot {
  std::unique_ptr<Quorum> quorum;   // restored, or new when the key does not exist
  std::int64_t state_revision = 0;  // 0: the key does not exist
  Json before;                      // decisions() of the state as read
  std::set<std::string> alive;
  std::int64_t revision = 0;
};

etcd::Task<Result<Snapshot>> read_snapshot(etcd::Kv& client, std::string state_key,
                                           std::string alive_prefix, const Clock& clock,
                                           QuorumConfig config) {
  etcd::Txn read;
  read.success = {etcd::range_op(state_key),
                  etcd::range_op(alive_prefix, etcd::prefix_end(alive_prefix))};
  auto got = co_await client.txn(std::move(read));
  if (!got) co_return got.error();
  if (got.value().ranges.size() != 2) {
    co_return Error{ErrorCode::kInternal, "etcd quorum: a read of 2 ranges answered " +
                                              std::to_string(got.value().ranges.size())};
  }
  Snapshot out;
  out.revision = got.value().revision;
  const auto& state = got.value().ranges[0].kvs;
  if (!state.empty()) {
    out.state_revision = state.front().mod_revision;
    Json saved = Json::parse(state.front().value, nullptr, false);
    if (saved.is_discarded()) {
      co_return Error{ErrorCode::kInternal, "etcd quorum: " + state_key + " is not JSON"};
    }
    auto restored = Quorum::restore(saved, clock);
    if (!restored) co_return restored.error();
    out.quorum = std::move(restored).value();
    out.before = decisions(std::move(saved));
  } else {
    // The job's first ask: its quorums meet under a store root of their own, so that a job
    // started again under the same id never meets in an old quorum's keys.
    out.quorum = std::make_unique<Quorum>(config, clock, "quorum/" + random_hex(6) + "/");
  }
  for (const auto& kv : got.value().ranges[1].kvs) {
    out.alive.insert(kv.key.substr(alive_prefix.size()));
  }
  co_return out;
}

}  // namespace

std::string etcd_quorum_prefix(const std::string& job) { return etcd_job_prefix(job) + "quorum/"; }

EtcdQuorum::EtcdQuorum(etcd::Kv& client, const std::string& job, std::string replica_id,
                       const Clock& clock)
    : client_(client),
      clock_(clock),
      replica_id_(std::move(replica_id)),
      prefix_(etcd_quorum_prefix(job)),
      state_key_(prefix_ + "state"),
      alive_prefix_(prefix_ + "alive/") {}

etcd::Task<Status> EtcdQuorum::stay_alive(bool force) {
  if (lease_ != 0 && !force && clock_.now() - renewed_ < std::chrono::seconds(ttl_seconds_) / 3) {
    co_return ok_status();
  }
  if (lease_ != 0) {
    auto left = co_await client_.keep_alive(lease_);
    if (!left) co_return left.error();
    if (left.value() > 0) {
      renewed_ = clock_.now();
      co_return ok_status();
    }
    lease_ = 0;  // expired: the others may have let this replica go; it asks again
  }
  auto granted = co_await client_.grant(ttl_seconds_);
  if (!granted) co_return granted.error();
  auto put = co_await client_.put(alive_prefix_ + replica_id_, "", granted.value().id);
  if (!put) co_return put.error();
  lease_ = granted.value().id;
  renewed_ = clock_.now();
  co_return ok_status();
}

etcd::Task<Status> EtcdQuorum::heartbeat() {
  if (ttl_seconds_ == 0) co_return ok_status();
  co_return co_await stay_alive(true);
}

etcd::Task<Status> EtcdQuorum::leave() {
  if (lease_ == 0) co_return ok_status();
  const auto lease = lease_;
  lease_ = 0;
  auto revoked = co_await client_.revoke(lease);
  if (!revoked && revoked.error().code != ErrorCode::kNotFound) co_return revoked.error();
  co_return ok_status();
}

etcd::Task<Result<QuorumAssignment>> EtcdQuorum::ask(QuorumRequest request, Duration timeout) {
  if (request.member.replica_id != replica_id_) {
    co_return Error{ErrorCode::kBadRequest, "etcd quorum: an ask for replica '" +
                                                request.member.replica_id +
                                                "' on the connection of '" + replica_id_ + "'"};
  }
  if (auto valid = validate(request.config); !valid) co_return valid.error();
  const auto heartbeat_ms = to_millis(request.config.heartbeat_timeout);
  ttl_seconds_ = std::max<std::int64_t>(1, (heartbeat_ms + 999) / 1000);
  const TimePoint deadline = clock_.now() + timeout;
  // formations() when this replica's ask went in: a later formation that has it as a member
  // is its answer.
  std::optional<std::int64_t> asked_at;
  int losses = 0;
  for (;;) {
    if (auto alive = co_await stay_alive(false); !alive) co_return alive.error();
    auto read = co_await read_snapshot(client_, state_key_, alive_prefix_, clock_, request.config);
    if (!read) co_return read.error();
    Snapshot& snapshot = read.value();
    Quorum* quorum = snapshot.quorum.get();

    std::vector<QuorumNotice> notices;
    auto take = [&](std::vector<QuorumNotice> more) {
      for (auto& n : more) notices.push_back(std::move(n));
    };
    for (const auto& id : quorum->known()) {
      if (!snapshot.alive.count(id)) take(quorum->remove(id));
    }
    const bool waiting = contains(quorum->waiting(), replica_id_);
    if (asked_at && quorum->formations() > *asked_at && !waiting) {
      // Another replica's write formed the quorum this one waited for.
      if (auto mine = quorum->assignment(replica_id_)) co_return *mine;
    }
    const std::int64_t formations = quorum->formations();
    // Not asked yet, or left out (gone by its lease while it waited): ask (again).
    const bool asks = !asked_at || !waiting;
    if (request.finished) {
      take(quorum->finish(request.member));
    } else if (asks) {
      take(quorum->ask(request.member, request.rebuild));
    }
    take(quorum->tick());

    std::int64_t watch_from = snapshot.revision + 1;
    if (Json after = quorum->save(); decisions(after) != snapshot.before) {
      etcd::Txn write;
      write.compare = {etcd::unchanged_since(state_key_, snapshot.state_revision)};
      write.success = {etcd::put_op(state_key_, after.dump())};
      auto wrote = co_await client_.txn(std::move(write));
      if (!wrote) co_return wrote.error();
      if (!wrote.value().succeeded) {
        co_await sleep_for(etcd::contention_backoff(++losses));
        continue;  // another replica wrote first: decide again on what it wrote
      }
      losses = 0;
      if (asks) asked_at = formations;
      watch_from = wrote.value().revision + 1;
    }
    for (const auto& n : notices) {
      if (n.replica_id != replica_id_) continue;
      if (request.finished) (void)co_await leave();  // best effort: else the lease expires
      co_return n.assignment;
    }

    // Wait for a write (a formation, a replica gone or back) or the next deadline, waking in
    // time to renew the lease.
    const TimePoint now = clock_.now();
    if (now >= deadline) {
      co_return Error{ErrorCode::kTimeout, "no quorum formed within " +
                                               std::to_string(to_millis(timeout)) +
                                               " ms: " + quorum->why_waiting()};
    }
    TimePoint until = std::min(deadline, renewed_ + std::chrono::seconds(ttl_seconds_) / 3);
    if (auto due = quorum->next_deadline()) until = std::min(until, std::max(*due, now));
    auto waited =
        co_await etcd::watch_until(client_, prefix_, etcd::prefix_end(prefix_), watch_from,
                                   std::chrono::steady_clock::now() + (until - now),
                                   [](const etcd::WatchMessage& m) { return !m.events.empty(); });
    if (!waited && waited.error().code != ErrorCode::kTimeout) {
      co_await sleep_for(std::chrono::milliseconds(100));  // a broken stream: read again
    }
  }
}

}  // namespace ctrun::rendezvous
