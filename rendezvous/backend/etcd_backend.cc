// The Backend over etcd. There is no daemon: every agent runs the same Rendezvous on the job's
// one state key ("rendezvous", Rendezvous::save() JSON). An action (join, report, leave, a
// deadline, a node's lease gone) reads the state, applies the call ctrund would make, and
// writes it back in a transaction that compares the key's mod_revision, retrying when another
// agent wrote first. Each agent watches the job's keys and reads its own notices from the state
// (its assignment, a reopened round, the job's end). A node's liveness is its lease: its
// "nodes/<id>" key vanishes when keep-alives stop, and any agent that sees that removes it.
#include <boost/asio.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "rendezvous/backend/backend.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/protocol/auth.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;

namespace {

using Clock = std::chrono::steady_clock;

// With etcd the Rendezvous's own keep-alive deadline is off: leases say who is alive.
constexpr Duration kNoKeepAliveDeadline = std::chrono::hours(24 * 365);
// How long one action keeps retrying a write that etcd did not take (members down, no quorum).
constexpr Duration kWriteTimeout = std::chrono::seconds(30);

RendezvousConfig without_keep_alives(RendezvousConfig c) {
  c.keep_alive_interval = kNoKeepAliveDeadline;
  c.keep_alive_max_attempt = 1;
  return c;
}

// A join as an agent leaves it under joins/<node id>, on its lease, for whichever agent writes
// the state next: under contention one write takes in every join it sees (up to
// kJoinsPerWrite), instead of each agent winning a compare-and-swap of its own.
constexpr std::size_t kJoinsPerWrite = 120;  // a compare and a delete each; etcd allows 128

// Another agent's request, as it left it under joins/<its id>; nullopt for a value that is not
// one (it is left alone: that agent's own join says what is wrong).
std::optional<JoinRequest> parse_join_request(const std::string& node_id, const std::string& text) {
  auto request = join_request_from_json(Json::parse(text, nullptr, false));
  if (!request || request.value().node.node_id != node_id) return std::nullopt;
  return request.value();
}

std::int64_t whole_seconds_up(Duration d) {
  const auto ms = to_millis(d);
  return std::max<std::int64_t>(2, (ms + 999) / 1000);  // etcd's shortest lease is about 2 s
}

// This host's address on the way to `ep`: a "connected" UDP socket sends nothing.
std::string local_address_towards(asio::io_context& io, const Endpoint& ep) {
  boost::system::error_code ec;
  asio::ip::udp::resolver resolver(io);
  auto found = resolver.resolve(ep.host, std::to_string(ep.port), ec);
  if (ec || found.empty()) return "";
  asio::ip::udp::socket socket(io);
  const auto target = found.begin()->endpoint();
  socket.open(target.protocol(), ec);
  if (!ec) socket.connect(target, ec);
  if (ec) return "";
  const auto local = socket.local_endpoint(ec);
  return ec ? "" : local.address().to_string();
}

Task<void> sleep_for(asio::io_context& io, Duration d) {
  asio::steady_timer t(io, d);
  co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
}

// One connection to etcd: the options' own, else a gateway Client.
std::unique_ptr<etcd::Kv> connect_kv(asio::io_context& io, const EtcdBackendOptions& options,
                                     const etcd::ClientOptions& client) {
  if (options.connect_kv) return options.connect_kv(client);
  return std::make_unique<etcd::Client>(io, client);
}

class EtcdRendezvous : public std::enable_shared_from_this<EtcdRendezvous> {
 public:
  // What a change to the state may do: replace the Rendezvous (a new job under the same id),
  // add operations to the write and conditions to its compare-and-swap. `log` and `events` are
  // what a Rendezvous it creates should use. `applied` lists the join requests it took in.
  struct Edit {
    std::unique_ptr<Rendezvous>& state;
    std::vector<etcd::Operation>& also;
    std::vector<etcd::Compare>& checks;
    std::vector<std::string>& applied;
    Rendezvous::Logger log;
    EventSink events;
  };
  using Change = std::function<Status(Edit&)>;

  EtcdRendezvous(asio::io_context& io, EtcdBackendOptions options)
      : io_(io),
        options_(std::move(options)),
        prefix_(etcd_job_prefix(options_.job)),
        state_key_(prefix_ + "rendezvous"),
        nodes_prefix_(prefix_ + "nodes/"),
        joins_prefix_(prefix_ + "joins/"),
        store_prefix_(prefix_ + "store/"),
        ops_prefix_(prefix_ + "ops/"),
        client_(connect_kv(io, options_, {.endpoints = options_.endpoints})),
        // Keep-alives must not wait out a long request timeout: the lease would be gone first.
        lease_client_(connect_kv(io, options_,
                                 {.endpoints = options_.endpoints,
                                  .request_timeout = options_.lease_ttl / 3,
                                  .attempt_timeout = options_.lease_ttl / 3})),
        store_client_(connect_kv(io, options_, {.endpoints = options_.endpoints})),
        tick_timer_(io) {}

  void set_event_handler(Backend::EventHandler handler) { on_event_ = std::move(handler); }
  bool connected() const { return lease_ != 0 && !lost_ && !closed_; }
  const std::string& local_address() const { return local_address_; }
  const std::vector<Endpoint>& endpoints() const { return options_.endpoints; }

  Task<Status> connect() {
    closed_ = false;
    const auto until = Clock::now() + options_.connect_timeout;
    Duration backoff = std::chrono::milliseconds(100);
    while (true) {
      // Bounded by this connect's own deadline, whatever etcd does; each refusal is told.
      const Duration left = std::max<Duration>(until - Clock::now(), std::chrono::milliseconds(1));
      auto granted = co_await client_->grant(
          whole_seconds_up(options_.lease_ttl), left, [this](const Error& e) {
            emit(BackendEvent{.kind = BackendEvent::Kind::kConnectAttemptFailed,
                              .reason = e.message});
          });
      if (granted) {
        lease_ = granted.value().id;
        break;
      }
      if (granted.error().code != ErrorCode::kConnection || Clock::now() + backoff >= until) {
        co_return Error{granted.error().code, "cannot reach etcd: " + granted.error().message};
      }
      co_await sleep_for(io_, backoff);
      backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(2));
    }
    if (local_address_.empty() && !options_.endpoints.empty()) {
      local_address_ = local_address_towards(io_, options_.endpoints.front());
    }
    if (!watching_) {
      watching_ = true;
      asio::co_spawn(io_, watch_loop(shared_from_this()), asio::detached);
    }
    while (!loaded_) {
      if (Clock::now() >= until) {
        co_return Error{ErrorCode::kTimeout, "cannot read job '" + options_.job + "' from etcd"};
      }
      co_await wait_change(std::min(until, Clock::now() + std::chrono::seconds(1)));
    }
    lost_ = false;
    co_return ok_status();
  }

  // Renews at least three times per TTL, whatever the interval, so that a failed renewal or two
  // still leave the lease alive (the TTL is interval x max_missed already).
  void start_keep_alive(Duration interval, int /*max_missed*/) {
    keep_alive_interval_ = std::min(interval, options_.lease_ttl / 3);
    spawn_keep_alive();
  }

  Task<void> release() {
    const std::int64_t lease = lease_;
    close();
    // Revoked, the node's key goes now instead of when the lease runs out.
    if (lease != 0) (void)co_await lease_client_->revoke(lease);
  }

  void close() {
    closed_ = true;
    ++keep_alive_epoch_;
    client_->cancel_watches();
    store_client_->cancel_watches();
    tick_timer_.cancel();
    tick_at_.reset();
    notify();
  }

  Task<Result<RoundAssignment>> join(NodeInfo node, RendezvousConfig config) {
    auto joined = co_await join_round(std::move(node), std::move(config));
    // A request left behind could be taken in by a later write: a node that is not coming.
    if (!joined) co_await drop_join_request();
    co_return joined;
  }

  Task<Result<RoundAssignment>> join_round(NodeInfo node, RendezvousConfig config) {
    node_id_ = node.node_id;
    running_round_.reset();
    end_sent_ = false;
    if (auto s = co_await put_node_key(); !s) co_return s.error();
    const RendezvousConfig wanted = without_keep_alives(config);
    const std::string request = to_json(JoinRequest{node, config}).dump();
    auto enter = [&](Edit& edit) -> Status {
      std::unique_ptr<Rendezvous>& r = edit.state;
      // Every node of an ended job is gone: the same id starts a new job, as with ctrund. Its
      // store (and its add markers) go with the old job.
      const bool replace = r && r->state() != JobState::kRunning && !any_live(*r);
      if (!r || replace) {
        const int generation = r ? r->generation() + 1 : 0;
        if (r) {
          edit.also.push_back(etcd::delete_op(store_prefix_, etcd::prefix_end(store_prefix_)));
          edit.also.push_back(etcd::delete_op(ops_prefix_, etcd::prefix_end(ops_prefix_)));
        }
        r = std::make_unique<Rendezvous>(options_.job, wanted, clock_, edit.log, generation);
        r->set_event_sink(edit.events);
      } else if (r->config().min_nodes != config.min_nodes ||
                 r->config().max_nodes != config.max_nodes) {
        return Error{ErrorCode::kConflict,
                     "job '" + options_.job + "' runs with nnodes " +
                         std::to_string(r->config().min_nodes) + ":" +
                         std::to_string(r->config().max_nodes) + ", this node asked for " +
                         std::to_string(config.min_nodes) + ":" + std::to_string(config.max_nodes)};
      }
      return take_in_joins(edit);
    };
    if (auto asked = co_await ask_to_join(request, enter); !asked) co_return asked.error();
    // The answer is in the state once the round forms; each change wakes this. (`r` is good
    // until the next co_await.)
    while (true) {
      if (closed_) co_return Error{ErrorCode::kClosed, "the rendezvous client closed"};
      auto current = view();
      if (!current) co_return current.error();
      const Rendezvous* r = current.value();
      if (!r) co_return Error{ErrorCode::kClosed, "etcd key " + state_key_ + " was deleted"};
      if (r->state() != JobState::kRunning) {
        co_return Error{ErrorCode::kClosed, "job '" + options_.job + "' ended (" +
                                                std::string(job_state_name(r->state())) +
                                                "): " + r->end_reason()};
      }
      // Asked and not taken in yet: this node's request is not in the state (the cache of
      // requests is only as fresh as the last read).
      const bool pending =
          joins_.count(node_id_) != 0 && !r->is_joining(node_id_) && !r->assignment(node_id_);
      if (!r->has_node(node_id_) && !pending) {
        co_return Error{ErrorCode::kTimeout,
                        "dropped from job '" + options_.job +
                            "': " + r->departure(node_id_).value_or("removed by another node")};
      }
      if (auto a = r->assignment(node_id_)) {
        running_round_ = a->round;
        reported_round_ = std::max(reported_round_, a->round);
        co_return *a;
      }
      if (pending) {
        // Not taken in yet (the write that would have lost its race): take it in now.
        if (auto joined = co_await mutate(enter); !joined) co_return joined.error();
        continue;
      } else if (!r->is_joining(node_id_)) {
        // The round this node entered formed and reopened before this node read the state
        // (a watch may bring several changes at once): it joins the next round, as it would
        // have on the reopened round's notice.
        if (auto asked = co_await ask_to_join(request, enter); !asked) co_return asked.error();
        continue;
      }
      co_await wait_change(Clock::now() + std::chrono::seconds(1));
    }
  }

  Task<Result<Json>> resume(std::string node_id) {
    co_await reload_state();
    auto current = restore_current();
    if (!current) co_return current.error();
    const std::unique_ptr<Rendezvous>& r = current.value();
    if (!r || !r->has_node(node_id)) {
      co_return Error{ErrorCode::kNotFound,
                      "node '" + node_id + "' is not in job '" + options_.job + "'"};
    }
    node_id_ = std::move(node_id);
    if (auto s = co_await put_node_key(); !s) co_return s.error();
    co_return Json{{"round", r->round()},
                   {"formed", r->formed()},
                   {"state", std::string(job_state_name(r->state()))}};
  }

  Task<Status> report(bool succeeded, std::string message) {
    co_return co_await mutate([&](Edit& edit) -> Status {
      if (!edit.state) return Error{ErrorCode::kConflict, "job '" + options_.job + "' is gone"};
      auto notices = edit.state->report(node_id_, succeeded, message);
      return notices ? ok_status() : Status(notices.error());
    });
  }

  Task<Status> leave() {
    running_round_.reset();
    co_await drop_join_request();
    co_return co_await mutate([&](Edit& edit) -> Status {
      if (edit.state) edit.state->remove_node(node_id_, "left");
      return ok_status();
    });
  }

  Task<Status> set(std::string key, std::string value) {
    auto put = co_await client_->put(store_prefix_ + key, value);
    co_return put ? ok_status() : Status(put.error());
  }

  // Waits for the key on a watch of its own (store_client_): the state's watch leaves store/
  // out, where the workers' keys come and go; then reads it.
  Task<Result<std::string>> get(std::string key, std::optional<Duration> timeout) {
    while (true) {
      std::vector<std::string> keys{key};
      auto waited =
          co_await etcd::store_wait(*store_client_, store_prefix_, std::move(keys), timeout);
      if (!waited) co_return waited.error();
      auto found = co_await client_->range(store_prefix_ + key);
      if (!found) co_return found.error();
      if (!found.value().kvs.empty()) co_return found.value().kvs.front().value;
      if (closed_) co_return Error{ErrorCode::kClosed, "the rendezvous client closed"};
      // Set, then deleted before this read: wait again.
    }
  }

  // The marker (etcd_store.h) is a key of this call's own, on this node's lease.
  Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) {
    co_return co_await etcd::store_add(*client_, store_prefix_, std::move(key), delta,
                                       ops_prefix_ + random_hex(8), lease_);
  }

 private:
  // Leaves this node's join request, then writes the state with it (and any others) taken in,
  // unless another agent's write takes it in first.
  Task<Status> ask_to_join(std::string request, Change enter) {
    const std::string key = joins_prefix_ + node_id_;
    auto put = co_await client_->put(key, request, lease_);
    if (!put) co_return put.error();
    etcd::KeyValue kv;
    kv.key = key;
    kv.value = request;
    kv.mod_revision = put.value();
    kv.lease = lease_;
    joins_[node_id_] = kv;
    co_await reload_state();  // every request so far, to take in with this one
    co_return co_await mutate(std::move(enter));
  }

  Task<void> drop_join_request() {
    if (node_id_.empty() || !joins_.count(node_id_)) co_return;
    joins_.erase(node_id_);
    (void)co_await client_->erase(joins_prefix_ + node_id_);
  }

  // Takes the pending join requests into the running job, this node's first, at most
  // kJoinsPerWrite. Each is deleted by the same write, on condition that it is the very
  // request that was read: no request is ever taken in twice. Requests that do not fit the
  // job (another nnodes, a taken rank) are left to their agents, whose own join says why.
  Status take_in_joins(Edit& edit) {
    Rendezvous& r = *edit.state;
    if (r.state() != JobState::kRunning) return ok_status();
    std::vector<std::string> order;
    if (joins_.count(node_id_)) order.push_back(node_id_);
    for (const auto& [id, kv] : joins_) {
      if (id != node_id_) order.push_back(id);
    }
    for (const auto& id : order) {
      if (edit.applied.size() >= kJoinsPerWrite) break;
      const etcd::KeyValue& kv = joins_.at(id);
      auto request = parse_join_request(id, kv.value);
      if (!request || request->config.min_nodes != r.config().min_nodes ||
          request->config.max_nodes != r.config().max_nodes) {
        continue;
      }
      if (auto joined = r.join(request->node); !joined) {
        if (id == node_id_) return joined.error();
        continue;
      }
      edit.checks.push_back(etcd::Compare{kv.key, etcd::Compare::Target::kMod,
                                          etcd::Compare::Result::kEqual, kv.mod_revision, ""});
      edit.also.push_back(etcd::delete_op(kv.key));
      edit.applied.push_back(id);
    }
    return ok_status();
  }

  // Puts this node's key on its lease, taking a new lease when the old one is gone.
  Task<Status> put_node_key() {
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto put = co_await client_->put(nodes_prefix_ + node_id_, local_address_, lease_);
      if (put) {
        live_.insert(node_id_);
        dead_.erase(node_id_);
        co_return ok_status();
      }
      if (put.error().code != ErrorCode::kNotFound || attempt > 0) co_return put.error();
      auto granted = co_await client_->grant(whole_seconds_up(options_.lease_ttl));
      if (!granted) co_return granted.error();
      lease_ = granted.value().id;
      if (lost_ && keep_alive_interval_ > Duration::zero()) {
        // lose() stopped the renewals of the old lease: the new one needs its own.
        lost_ = false;
        spawn_keep_alive();
      }
    }
    co_return ok_status();
  }

  // The cached state as a Rendezvous (null when the key does not exist), deadlines carried.
  Result<std::unique_ptr<Rendezvous>> restore_current(Rendezvous::Logger log = {}) const {
    if (state_json_.is_null()) return std::unique_ptr<Rendezvous>();
    if (state_json_.is_discarded()) {
      return Error{ErrorCode::kBadRequest,
                   "etcd key " + state_key_ + " does not hold a ctrun rendezvous"};
    }
    return Rendezvous::restore(state_json_, clock_, std::move(log), Rendezvous::Timers::kCarried);
  }

  // The cached state restored once per revision, for reading: every agent reads it on every
  // change, and a restore is O(nodes). Null when the key does not exist.
  Result<const Rendezvous*> view() {
    if (view_rev_ != state_rev_ || !view_ok_) {
      auto current = restore_current();
      if (!current) return current.error();
      view_ = std::move(current).value();
      view_rev_ = state_rev_;
      view_ok_ = true;
    }
    return static_cast<const Rendezvous*>(view_.get());
  }

  // Takes what a read at `revision` saw of the state key, unless the cache is newer.
  void take_state(const etcd::KeyValue* kv, std::int64_t revision) {
    if (revision < state_rev_) return;
    if (kv) {
      state_json_ = Json::parse(kv->value, nullptr, false);
      state_rev_ = kv->mod_revision;
      view_ok_ = false;
    } else {
      state_json_ = nullptr;
      state_rev_ = 0;
      view_ok_ = false;
    }
  }

  // One consistent read of the state and the live nodes; the revision it saw.
  Task<Result<std::int64_t>> load() {
    etcd::Txn txn;
    txn.success.push_back(etcd::range_op(state_key_, ""));
    txn.success.push_back(etcd::range_op(nodes_prefix_, etcd::prefix_end(nodes_prefix_)));
    txn.success.push_back(etcd::range_op(joins_prefix_, etcd::prefix_end(joins_prefix_)));
    auto read = co_await client_->txn(std::move(txn));
    if (!read) co_return read.error();
    const etcd::TxnResult& r = read.value();
    if (r.ranges.size() != 3) {
      co_return Error{ErrorCode::kInternal, "etcd: a three-range transaction answered " +
                                                std::to_string(r.ranges.size()) + " ranges"};
    }
    const etcd::KeyValue* state = r.ranges[0].kvs.empty() ? nullptr : &r.ranges[0].kvs.front();
    take_state(state, r.revision);
    take_joins(r.ranges[2].kvs, r.revision);
    live_.clear();
    for (const auto& kv : r.ranges[1].kvs) live_.insert(kv.key.substr(nodes_prefix_.size()));
    // Dead: nodes of the state *as this read saw it* without a key (the cache may be newer, with
    // nodes whose keys this read predates), and those seen deleted before, unless back now.
    std::erase_if(dead_, [this](const std::string& id) { return live_.count(id) != 0; });
    if (state) {
      auto read = etcd_restore_state(*state, clock_);
      if (read) {
        for (const auto& id : read.value()->node_ids()) {
          if (!live_.count(id)) dead_.insert(id);
        }
      }
    }
    loaded_ = true;
    after_change();
    co_return r.revision;
  }

  // The state and the pending join requests, read together: a request is deleted by the write
  // that takes it in, so the two must come from one revision.
  Task<void> reload_state() {
    etcd::Txn txn;
    txn.success.push_back(etcd::range_op(state_key_, ""));
    txn.success.push_back(etcd::range_op(joins_prefix_, etcd::prefix_end(joins_prefix_)));
    auto read = co_await client_->txn(std::move(txn));
    if (!read || read.value().ranges.size() != 2) {
      co_await sleep_for(io_, std::chrono::milliseconds(100));
      co_return;
    }
    const etcd::TxnResult& r = read.value();
    take_state(r.ranges[0].kvs.empty() ? nullptr : &r.ranges[0].kvs.front(), r.revision);
    take_joins(r.ranges[1].kvs, r.revision);
    after_change();
  }

  // Takes what a read at `revision` saw under joins/, unless the cache is newer.
  void take_joins(const std::vector<etcd::KeyValue>& kvs, std::int64_t revision) {
    if (revision < joins_rev_) return;
    // This node's own request, put after the read was answered, stays.
    std::optional<etcd::KeyValue> own;
    if (auto it = joins_.find(node_id_); it != joins_.end() && it->second.mod_revision > revision) {
      own = it->second;
    }
    joins_.clear();
    for (const auto& kv : kvs) joins_[kv.key.substr(joins_prefix_.size())] = kv;
    if (own) joins_[node_id_] = *own;
    joins_rev_ = revision;
  }

  // Reads everything, then follows the changes; again from a fresh read whenever the stream
  // ends (etcd restarted, a member lost, history compacted), until close().
  Task<void> watch_loop([[maybe_unused]] std::shared_ptr<EtcdRendezvous> self) {
    Duration backoff = std::chrono::milliseconds(100);
    while (!closed_) {
      auto loaded = co_await load();
      if (!loaded) {
        if (!closed_) co_await sleep_for(io_, backoff);
        backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(1));
        continue;
      }
      backoff = std::chrono::milliseconds(100);
      // nodes/ to rendezvous (ops/ lies between): not the join requests, read when a write is
      // due, nor store/, where every worker's key goes: N of them seen by N watchers would be N^2
      // messages.
      (void)co_await client_->watch(nodes_prefix_, etcd::prefix_end(state_key_), loaded.value() + 1,
                                    [this](const etcd::WatchMessage& m) { on_watch(m); });
    }
  }

  void on_watch(const etcd::WatchMessage& message) {
    bool changed = false;  // ops/ (store add markers) changes nothing here
    for (const auto& e : message.events) {
      const std::string& key = e.kv.key;
      if (key == state_key_) {
        take_state(e.deleted ? nullptr : &e.kv, e.kv.mod_revision);
        changed = true;
      } else if (key.compare(0, nodes_prefix_.size(), nodes_prefix_) == 0) {
        changed = true;
        const std::string id = key.substr(nodes_prefix_.size());
        if (e.deleted) {
          live_.erase(id);
          dead_.insert(id);
        } else {
          live_.insert(id);
          dead_.erase(id);
        }
      }
    }
    if (changed) after_change();
  }

  bool any_live(const Rendezvous& r) const {
    for (const auto& id : r.node_ids()) {
      if (id != node_id_ && live_.count(id)) return true;
    }
    return false;
  }

  // What every change of the cache sets off: waiters wake, this node's notices go out, nodes
  // whose leases are gone are removed, and the next deadline is armed.
  void after_change() {
    notify();
    if (closed_) return;
    auto current = view();
    if (!current || !current.value()) return;
    const Rendezvous& r = *current.value();
    deliver_notices(r);
    arm_tick(r);
    remove_dead(r);
  }

  void deliver_notices(const Rendezvous& r) {
    if (!running_round_) return;
    if (r.state() != JobState::kRunning) {
      if (!end_sent_) {
        end_sent_ = true;
        emit(BackendEvent{.kind = BackendEvent::Kind::kJobEnded,
                          .state = std::string(job_state_name(r.state())),
                          .reason = r.end_reason()});
      }
      return;
    }
    if (r.round() > reported_round_) {
      reported_round_ = r.round();
      emit(BackendEvent{.kind = BackendEvent::Kind::kRoundReopened,
                        .round = r.round(),
                        .reason = r.open_reason()});
      return;
    }
    if (!r.has_node(node_id_) && !lost_) {
      lose("dropped from job '" + options_.job +
           "': " + r.departure(node_id_).value_or("removed by another node"));
    }
  }

  void arm_tick(const Rendezvous& r) {
    auto due = r.next_deadline();
    if (!due) {
      tick_timer_.cancel();
      tick_at_.reset();
      return;
    }
    // A little spread, so that not every agent writes the same tick at once.
    static thread_local std::minstd_rand jitter(std::random_device{}());
    // Not sooner than 100 ms from now: a deadline already past (the wall-clock save and this
    // steady clock disagree by a few ms) is tried again, not spun on.
    const auto at = std::max(*due, Clock::now() + std::chrono::milliseconds(100)) +
                    std::chrono::milliseconds(jitter() % 50);
    // A tick already armed sooner stays: changes coming faster than 100 ms apart must not push
    // a due tick back forever. (One that finds nothing due re-arms from the state it sees.)
    if (tick_at_ && *tick_at_ <= at) return;
    tick_at_ = at;
    tick_timer_.expires_at(at);
    tick_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_) return;
      self->tick_at_.reset();
      auto tick = [](Edit& edit) -> Status {
        if (edit.state) edit.state->tick();
        return ok_status();
      };
      asio::co_spawn(self->io_, self->apply(self, tick, false), asio::detached);
    });
  }

  void remove_dead(const Rendezvous& view) {
    if (removing_) return;
    auto candidate = [&](const std::string& id) {
      return id != node_id_ && !live_.count(id) && view.has_node(id);
    };
    if (std::none_of(dead_.begin(), dead_.end(), candidate)) return;
    // Which removals would change the state (not, e.g., a member that already succeeded): tried
    // on a copy of its own.
    auto current = restore_current();
    if (!current || !current.value()) return;
    Rendezvous& r = *current.value();
    std::vector<std::string> gone;
    for (const auto& id : dead_) {
      if (!candidate(id)) continue;
      const auto before = r.revision();
      r.remove_node(id, "");
      if (r.revision() != before) gone.push_back(id);
    }
    if (gone.empty()) return;
    removing_ = true;
    const std::string why = "its etcd lease expired (no keep-alive for " +
                            std::to_string(whole_seconds_up(options_.lease_ttl)) + " s)";
    auto remove = [gone, why](Edit& edit) -> Status {
      for (const auto& id : gone) {
        if (edit.state) edit.state->remove_node(id, why);
      }
      return ok_status();
    };
    asio::co_spawn(io_, apply(shared_from_this(), remove, true), asio::detached);
  }

  // mutate() for a detached caller, which keeps this alive. A removal, once done, looks again:
  // more leases may have gone meanwhile.
  Task<void> apply([[maybe_unused]] std::shared_ptr<EtcdRendezvous> self, Change change,
                   bool removal) {
    Status done = ok_status();
    try {
      done = co_await mutate(std::move(change));
    } catch (const std::exception& e) {
      done = Error{ErrorCode::kInternal, e.what()};
    }
    if (!done && !closed_ && options_.log) options_.log("etcd: " + done.error().message);
    if (removal) removing_ = false;
    after_change();  // also re-arms the deadline when this tick found nothing due yet
  }

  // Applies `change` to the state and writes it back if it moved, with compare-and-swap.
  Task<Status> mutate(Change change) {
    const auto until = Clock::now() + kWriteTimeout;
    int lost = 0;
    while (true) {
      if (closed_) co_return Error{ErrorCode::kClosed, "the rendezvous client closed"};
      // Lines and events are kept until the write lands: a lost race must not tell them twice.
      std::vector<std::string> lines;
      std::vector<std::pair<std::string, Json>> events;
      auto log = [&lines](const std::string& line) { lines.push_back(line); };
      auto sink = [&events](const std::string& name, Json fields) {
        events.emplace_back(name, std::move(fields));
      };
      auto current = restore_current(log);
      if (!current) co_return current.error();
      std::unique_ptr<Rendezvous> state = std::move(current).value();
      const Rendezvous* original = state.get();
      if (state) state->set_event_sink(sink);
      const std::uint64_t before = state ? state->revision() : 0;
      std::vector<etcd::Operation> also;
      std::vector<etcd::Compare> checks;
      std::vector<std::string> applied;
      Edit edit{state, also, checks, applied, log, sink};
      if (auto s = change(edit); !s) co_return s;
      if (state && state->round_restart_count_unset()) {
        // This write forms the round: its members' restart count is the counter now, and the
        // write lands only if the counter is still what was read (a peer's restart for a
        // failure in the new round must not be counted in it).
        if (state.get() != original) {
          state->set_round_restart_count(0);  // a new job: this write deletes the old store
        } else {
          auto counter = co_await client_->range(store_prefix_ + kRestartsKey);
          if (!counter) co_return counter.error();
          const auto& kvs = counter.value().kvs;
          const long long used = kvs.empty() ? 0 : counter_value(kvs.front().value, 0);
          state->set_round_restart_count(static_cast<int>(std::max(0LL, used)));
          checks.push_back(etcd::unchanged_since(store_prefix_ + kRestartsKey,
                                                 kvs.empty() ? 0 : kvs.front().mod_revision));
        }
      }
      if (!state || (state.get() == original && state->revision() == before)) co_return ok_status();

      Json saved = state->save();
      etcd::Txn txn;
      txn.compare.push_back(etcd::unchanged_since(state_key_, state_rev_));
      for (auto& c : checks) txn.compare.push_back(std::move(c));
      // Text from workers (failure reasons) may not be UTF-8: replaced, never a throw.
      const std::string text = saved.dump(-1, ' ', false, Json::error_handler_t::replace);
      txn.success.push_back(etcd::put_op(state_key_, text));
      for (auto& op : also) txn.success.push_back(std::move(op));
      auto written = co_await client_->txn(std::move(txn));
      if (written && written.value().succeeded) {
        if (written.value().revision >= state_rev_) {
          state_json_ = std::move(saved);
          state_rev_ = written.value().revision;
          view_ok_ = false;
        }
        for (const auto& id : applied) {  // the write deleted their keys
          auto it = joins_.find(id);
          if (it != joins_.end() && it->second.mod_revision < written.value().revision) {
            joins_.erase(it);
          }
        }
        // A read older than this write must not bring those requests back.
        joins_rev_ = std::max(joins_rev_, written.value().revision);
        if (options_.log) {
          for (const auto& line : lines) options_.log(line);
        }
        if (options_.events) {
          for (auto& [name, fields] : events) options_.events(name, std::move(fields));
        }
        after_change();
        co_return ok_status();
      }
      if (!written && written.error().code != ErrorCode::kConnection &&
          written.error().code != ErrorCode::kTimeout) {
        co_return written.error();
      }
      if (Clock::now() >= until) {
        co_return written ? Error{ErrorCode::kConflict, "etcd: the job's state kept changing"}
                          : written.error();
      }
      // Another agent wrote first, or the answer was lost, or a try cut short landed and its
      // retry lost to it: read the state again. Our own write (its save time makes it unique)
      // is done; anything else gets the change applied anew. Many agents racing back off a
      // random while, growing with each loss: the winner's write may take their joins in.
      co_await sleep_for(io_, etcd::contention_backoff(++lost));
      co_await reload_state();
      if (state_json_ == Json::parse(text, nullptr, false)) {
        if (options_.log) {
          for (const auto& line : lines) options_.log(line);
        }
        after_change();
        co_return ok_status();
      }
    }
  }

  // Connection lost = no renewal for a whole TTL (the lease is gone or about to go), or etcd
  // saying the lease is gone. Every ~30 s the state is also read afresh, in case the watch
  // connection went silent without closing.
  Task<void> keep_alive_loop([[maybe_unused]] std::shared_ptr<EtcdRendezvous> self, int epoch) {
    auto renewed = Clock::now();
    auto refreshed = Clock::now();
    std::string last_error;
    while (!closed_ && epoch == keep_alive_epoch_) {
      co_await sleep_for(io_, keep_alive_interval_);
      if (closed_ || epoch != keep_alive_epoch_) co_return;
      const std::int64_t lease = lease_;
      auto ttl = co_await lease_client_->keep_alive(lease);
      if (closed_ || epoch != keep_alive_epoch_) co_return;
      if (lease != lease_) continue;  // a new lease was taken meanwhile
      if (ttl && ttl.value() > 0) {
        renewed = Clock::now();
      } else if (ttl) {
        lose("this node's etcd lease expired");
        co_return;
      } else {
        last_error = ttl.error().message;
      }
      if (Clock::now() - renewed >= options_.lease_ttl) {
        lose("no keep-alive reached etcd for " + std::to_string(to_millis(options_.lease_ttl)) +
             " ms: " + last_error);
        co_return;
      }
      if (Clock::now() - refreshed >= std::chrono::seconds(30)) {
        refreshed = Clock::now();
        co_await reload_state();
      }
    }
  }

  // A renewal loop of its own; the epoch ends any loop before it.
  void spawn_keep_alive() {
    asio::co_spawn(io_, keep_alive_loop(shared_from_this(), ++keep_alive_epoch_), asio::detached);
  }

  void lose(const std::string& reason) {
    if (lost_) return;
    lost_ = true;
    ++keep_alive_epoch_;
    emit(BackendEvent{.kind = BackendEvent::Kind::kConnectionLost, .reason = reason});
  }

  void emit(const BackendEvent& event) {
    if (on_event_) on_event_(event);
  }

  Task<void> wait_change(Clock::time_point until) {
    asio::steady_timer t(io_, until);
    waiters_.push_back(&t);
    co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
    std::erase(waiters_, &t);
  }

  void notify() {
    for (auto* t : waiters_) t->cancel();
  }

  asio::io_context& io_;
  EtcdBackendOptions options_;
  const std::string prefix_;
  const std::string state_key_;
  const std::string nodes_prefix_;
  const std::string joins_prefix_;
  const std::string store_prefix_;
  const std::string ops_prefix_;
  SteadyClock clock_;
  std::unique_ptr<etcd::Kv> client_;
  std::unique_ptr<etcd::Kv> lease_client_;
  std::unique_ptr<etcd::Kv> store_client_;  // store gets: their watches end by cancelling all of it
  asio::steady_timer tick_timer_;
  std::optional<Clock::time_point> tick_at_;  // when tick_timer_ fires, while armed
  Backend::EventHandler on_event_;
  std::string local_address_;
  std::vector<asio::steady_timer*> waiters_;

  bool closed_ = false;
  bool watching_ = false;
  bool removing_ = false;
  std::int64_t lease_ = 0;
  bool lost_ = false;
  int keep_alive_epoch_ = 0;
  Duration keep_alive_interval_{};  // zero until start_keep_alive()

  // The cache, kept by the watch: the state (null: no key; discarded: not ours) at state_rev_,
  // and the nodes whose keys exist (live_) or were seen to go (dead_).
  bool loaded_ = false;
  Json state_json_;
  std::int64_t state_rev_ = 0;
  std::unique_ptr<Rendezvous> view_;  // state_json_ restored, while view_ok_, at view_rev_
  std::int64_t view_rev_ = 0;
  bool view_ok_ = false;
  std::set<std::string> live_;
  std::set<std::string> dead_;
  // Join requests not taken in yet (joins/<id>) as the last read saw them, at joins_rev_.
  std::map<std::string, etcd::KeyValue> joins_;
  std::int64_t joins_rev_ = 0;

  std::string node_id_;
  std::optional<int> running_round_;  // the round this node runs in, after its join returned
  int reported_round_ = 0;            // the newest round this node knows of
  bool end_sent_ = false;
};

class EtcdBackend final : public Backend {
 public:
  EtcdBackend(asio::io_context& io, EtcdBackendOptions options)
      : impl_(std::make_shared<EtcdRendezvous>(io, std::move(options))) {}
  ~EtcdBackend() override { impl_->close(); }

  // Each call holds the implementation in its own frame, so a call still in flight when the
  // backend is destroyed ends cleanly instead of touching freed memory.
  Task<Status> connect() override {
    auto impl = impl_;
    co_return co_await impl->connect();
  }
  bool connected() const override { return impl_->connected(); }
  std::string local_address() const override { return impl_->local_address(); }
  // Not served, as with torch's etcd handler.
  std::optional<std::uint16_t> worker_store_port() const override { return std::nullopt; }
  StoreAddress store_address(const std::string& prefix) const override {
    return etcd_store_address(impl_->endpoints(), prefix);
  }
  void set_event_handler(EventHandler handler) override {
    impl_->set_event_handler(std::move(handler));
  }
  void start_keep_alive(Duration interval, int max_missed) override {
    impl_->start_keep_alive(interval, max_missed);
  }
  Task<void> release() override {
    auto impl = impl_;
    co_await impl->release();
  }
  Task<Result<RoundAssignment>> join(NodeInfo node, RendezvousConfig config) override {
    auto impl = impl_;
    co_return co_await impl->join(std::move(node), config);
  }
  Task<Result<Json>> resume(std::string node_id) override {
    auto impl = impl_;
    co_return co_await impl->resume(std::move(node_id));
  }
  Task<Status> report(bool succeeded, std::string message) override {
    auto impl = impl_;
    co_return co_await impl->report(succeeded, std::move(message));
  }
  Task<Status> leave() override {
    auto impl = impl_;
    co_return co_await impl->leave();
  }
  Task<Status> set(std::string key, std::string value) override {
    auto impl = impl_;
    co_return co_await impl->set(std::move(key), std::move(value));
  }
  Task<Result<std::string>> get(std::string key, std::optional<Duration> timeout) override {
    auto impl = impl_;
    co_return co_await impl->get(std::move(key), timeout);
  }
  Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) override {
    auto impl = impl_;
    co_return co_await impl->add(std::move(key), delta);
  }

 private:
  std::shared_ptr<EtcdRendezvous> impl_;
};

}  // namespace

std::unique_ptr<Backend> make_etcd_backend(asio::io_context& io, EtcdBackendOptions options) {
  return std::make_unique<EtcdBackend>(io, std::move(options));
}

}  // namespace ctrun::rendezvous
