// The worker store: torch's TCPStore clients served from a job's KeyValueStore, on the port of
// the daemon's own protocol (ServiceOptions::worker_store_job) or on a port of the job's own
// (ServiceOptions::worker_store_per_job). The keys are the job's, so `ctrun status`, the
// metrics and the --state_dir journal see them like any other.
#include <algorithm>

#include "rendezvous/protocol/tcpstore_wire.h"
#include "rendezvous/service/service.h"
#include "rendezvous/service/service_impl.h"

namespace ctrun::rendezvous {
namespace {

using tcpstore::Op;

// torch 1.13's watch notices.
constexpr std::uint8_t kKeyUpdated = 0;
constexpr std::uint8_t kKeyCreated = 1;
constexpr std::uint8_t kKeyDeleted = 2;

}  // namespace

std::string Service::Impl::current_prefix(const Job& job) {
  return job.rendezvous ? round_store_prefix(job.rendezvous->generation(), job.rendezvous->round())
                        : "worker_store/";
}

void Service::Impl::start_tcpstore(Connection& c, const std::string& job_name) {
  c.wire = Wire::kTcpStore;
  c.job = job_name;
  Job& job = job_named(c.job);
  ++job.connections;
  ++job.tcpstore_connections;
  // torch keeps a fresh TCPStore per round; a prefix per round gives the same: a worker of a
  // re-formed round never reads the keys of the last one.
  c.key_prefix = current_prefix(job);
  ++job.tcpstore_prefixes[c.key_prefix];
  c.tcpstore = std::make_unique<tcpstore::Decoder>();
}

void Service::Impl::drop_stale_rounds(Job& job) {
  const std::string current = current_prefix(job);
  for (auto it = job.tcpstore_prefixes.begin(); it != job.tcpstore_prefixes.end();) {
    if (it->second > 0 || it->first == current) {
      ++it;
      continue;
    }
    for (const auto& key : job.store.erase_prefix(it->first)) record_key(job.name, key);
    it = job.tcpstore_prefixes.erase(it);
  }
}

void Service::Impl::on_tcpstore_data(Connection& first, const char* data, std::size_t size) {
  const ConnectionId id = first.id;
  first.tcpstore->feed(data, size);
  while (true) {
    auto it = connections_.find(id);  // a request may have closed it
    if (it == connections_.end()) return;
    Connection& c = *it->second;
    Job& job = job_of(c);
    c.tcpstore->set_hint(job.unvalidated_dialect);
    auto req = c.tcpstore->next();
    if (!req) return reject(c, 0, req.error());
    if (const auto told = c.tcpstore->dialect();
        job.unvalidated_dialect == tcpstore::Dialect::kUndecided &&
        (told == tcpstore::Dialect::kLegacy || told == tcpstore::Dialect::kTorch21)) {
      job.unvalidated_dialect = told;
    }
    if (!req.value()) {
      if (!c.tcpstore->mid_request()) {
        c.mid_frame_since.reset();
      } else if (!c.mid_frame_since) {
        c.mid_frame_since = clock_.now();
      }
      return;
    }
    ++tcpstore_counts_[tcpstore::op_name(req.value()->op)];
    handle_tcpstore(c, *req.value());
  }
}

void Service::Impl::handle_tcpstore(Connection& c, tcpstore::Request& req) {
  Job& job = job_of(c);
  KeyValueStore& store = job.store;
  auto full = [&](const std::string& key) { return c.key_prefix + key; };
  auto answer = [&](std::string bytes) { send_to(c.id, std::move(bytes)); };
  // A store error (a limit, add on a value that is not a number) closes the connection, as in
  // torch's server: the wire cannot carry it.
  auto refuse = [&](const Error& e) {
    reject(c, 0, Error{e.code, std::string(tcpstore::op_name(req.op)) + ": " + e.message});
  };
  std::string out;
  switch (req.op) {
    case Op::kSet: {
      const std::string key = full(req.keys[0]);
      if (auto s = store.set(key, std::move(req.values[0])); !s) return refuse(s.error());
      return record_key(c.job, key);
    }
    case Op::kAppend: {
      const std::string key = full(req.keys[0]);
      if (auto s = store.append(key, req.values[0]); !s) return refuse(s.error());
      return record_key(c.job, key);
    }
    case Op::kMultiSet: {
      std::vector<std::string> keys;
      for (const auto& k : req.keys) keys.push_back(full(k));
      if (auto s = store.multi_set(keys, std::move(req.values)); !s) return refuse(s.error());
      for (const auto& k : keys) record_key(c.job, k);
      return;
    }
    case Op::kCompareSet: {
      const std::string key = full(req.keys[0]);
      auto now = store.compare_set(key, req.values[0], std::move(req.values[1]));
      if (!now) return refuse(now.error());
      record_key(c.job, key);
      tcpstore::append_bytes(out, now.value());
      return answer(std::move(out));
    }
    case Op::kGet: {
      // A client waits for the key first; one that did not gets an empty value (torch's libuv
      // server does the same).
      const std::string* value = store.find(full(req.keys[0]));
      tcpstore::append_bytes(out, value ? *value : std::string());
      return answer(std::move(out));
    }
    case Op::kMultiGet:
      for (const auto& k : req.keys) {
        const std::string* value = store.find(full(k));
        tcpstore::append_bytes(out, value ? *value : std::string());
      }
      return answer(std::move(out));
    case Op::kAdd: {
      const std::string key = full(req.keys[0]);
      auto sum = store.add(key, req.number);
      if (!sum) return refuse(sum.error());
      record_key(c.job, key);
      tcpstore::append_i64(out, sum.value());
      return answer(std::move(out));
    }
    case Op::kCheck: {
      std::vector<std::string> keys;
      for (const auto& k : req.keys) keys.push_back(full(k));
      tcpstore::append_u8(out,
                          store.check(keys) ? tcpstore::kCheckReady : tcpstore::kCheckNotReady);
      return answer(std::move(out));
    }
    case Op::kWait: {
      std::vector<std::string> keys;
      for (const auto& k : req.keys) keys.push_back(full(k));
      return tcpstore_wait(c, std::move(keys));
    }
    case Op::kCancelWait: {
      // What the client waited for is dropped; it reads this answer (after a stop-waiting that
      // was already on its way, if any) and reports its timeout.
      end_tcpstore(c, /*keep_watches=*/true);
      tcpstore::append_u8(out, tcpstore::kWaitCanceled);
      return answer(std::move(out));
    }
    case Op::kNumKeys:
      tcpstore::append_i64(out,
                           static_cast<std::int64_t>(store.keys_with_prefix(c.key_prefix).size()));
      return answer(std::move(out));
    case Op::kListKeys: {
      const auto keys = store.keys_with_prefix(c.key_prefix);
      tcpstore::append_i64(out, static_cast<std::int64_t>(keys.size()));
      for (const auto& k : keys) tcpstore::append_bytes(out, k.substr(c.key_prefix.size()));
      return answer(std::move(out));
    }
    case Op::kDeleteKey: {
      const std::string key = full(req.keys[0]);
      const bool deleted = store.erase(key);
      if (deleted) record_key(c.job, key);
      tcpstore::append_i64(out, deleted ? 1 : 0);
      return answer(std::move(out));
    }
    case Op::kPing:
      tcpstore::append_u32(out, req.nonce);
      return answer(std::move(out));
    case Op::kQueuePush:
      if (auto s = store.queue_push(full(req.keys[0]), std::move(req.values[0])); !s) {
        return refuse(s.error());
      }
      return;
    case Op::kQueuePop: {
      auto popped = store.queue_pop(full(req.keys[0]));
      tcpstore::append_i64(out, static_cast<std::int64_t>(popped.length_before));
      if (popped.value) tcpstore::append_bytes(out, *popped.value);
      return answer(std::move(out));
    }
    case Op::kQueueLen:
      tcpstore::append_i64(out, static_cast<std::int64_t>(store.queue_length(full(req.keys[0]))));
      return answer(std::move(out));
    case Op::kBarrier:
      return tcpstore_barrier(c, full(req.keys[0]), req.number);
    case Op::kWatchKey:
      return tcpstore_watch(c, full(req.keys[0]));
  }
}

void Service::Impl::tcpstore_wait(Connection& c, std::vector<std::string> keys) {
  Job& job = job_of(c);
  if (!job.store.check(keys) && c.waiters.size() >= options_.max_waiters_per_connection) {
    return reject(c, 0, Error{ErrorCode::kLimit, "too many waits outstanding on this connection"});
  }
  // torch's clients time a wait out themselves (then cancel it): the store never does.
  auto slot = std::make_shared<KeyValueStore::WaiterId>(0);
  const ConnectionId cid = c.id;
  auto done = [this, cid, slot](Status) {
    auto it = connections_.find(cid);
    if (it == connections_.end()) return;
    it->second->waiters.erase(*slot);
    std::string out;
    tcpstore::append_u8(out, tcpstore::kStopWaiting);
    send_to(cid, std::move(out));
  };
  *slot = job.store.wait(std::move(keys), TimePoint::max(), std::move(done));
  if (*slot != 0) c.waiters.insert(*slot);
}

// torch 2.x's barrier: every arrival counts at `key`; the last of `world_size` releases all.
void Service::Impl::tcpstore_barrier(Connection& c, const std::string& key,
                                     std::int64_t world_size) {
  Job& job = job_of(c);
  auto count = job.store.add(key, 1);
  if (!count) return reject(c, 0, Error{count.error().code, "barrier: " + count.error().message});
  record_key(c.job, key);
  std::string stop;
  tcpstore::append_u8(stop, tcpstore::kStopWaiting);
  if (count.value() < world_size) {
    job.barrier_waiters[key].push_back(c.id);
    c.barriers.insert(key);
    return;
  }
  std::vector<ConnectionId> released = std::move(job.barrier_waiters[key]);
  job.barrier_waiters.erase(key);
  released.push_back(c.id);
  for (ConnectionId id : released) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    it->second->barriers.erase(key);
    send_to(id, stop);
  }
}

// torch 1.13's watch_key (on the second connection each of its TCPStores opens): registered,
// then a notice on that connection for every change of the key, from any client.
void Service::Impl::tcpstore_watch(Connection& c, const std::string& key) {
  Job& job = job_of(c);
  if (c.watches.size() >= options_.max_waiters_per_connection) {
    return reject(c, 0, Error{ErrorCode::kLimit, "too many watches on this connection"});
  }
  if (job.watchers.empty()) {
    job.store.set_change_listener(
        [this, &job](const std::string& k, const std::string* before, const std::string* after) {
          auto w = job.watchers.find(k);
          if (w == job.watchers.end()) return;
          const std::uint8_t kind = !after ? kKeyDeleted : before ? kKeyUpdated : kKeyCreated;
          for (ConnectionId id : w->second) {
            auto it = connections_.find(id);
            if (it == connections_.end()) continue;
            std::string notice;
            tcpstore::append_u8(notice, kind);
            tcpstore::append_bytes(notice, k.substr(it->second->key_prefix.size()));
            tcpstore::append_bytes(notice, before ? *before : std::string());
            tcpstore::append_bytes(notice, after ? *after : std::string());
            send_to(id, std::move(notice));
          }
        });
  }
  job.watchers[key].insert(c.id);
  c.watches.insert(key);
  std::string out;
  tcpstore::append_u8(out, tcpstore::kCallbackRegistered);
  send_to(c.id, std::move(out));
}

void Service::Impl::end_tcpstore(Connection& c, bool keep_watches) {
  Job& job = job_of(c);
  for (auto w : c.waiters) job.store.cancel(w);
  c.waiters.clear();
  for (const auto& key : c.barriers) {
    auto it = job.barrier_waiters.find(key);
    if (it == job.barrier_waiters.end()) continue;
    std::erase(it->second, c.id);
    if (it->second.empty()) job.barrier_waiters.erase(it);
  }
  c.barriers.clear();
  if (keep_watches) return;
  for (const auto& key : c.watches) {
    auto it = job.watchers.find(key);
    if (it == job.watchers.end()) continue;
    it->second.erase(c.id);
    if (it->second.empty()) job.watchers.erase(it);
  }
  c.watches.clear();
  if (job.watchers.empty()) job.store.set_change_listener(nullptr);
}

}  // namespace ctrun::rendezvous
