// The Backend over etcd. There is no daemon: every agent runs the same Rendezvous on the job's
// one state key ("rendezvous", Rendezvous::save() deflated). An action (join, report, leave, a
// deadline, a node's lease gone) reads the state, applies the call ctrund would make, and
// writes it back in a transaction that compares the key's mod_revision, retrying when another
// agent wrote first. Each agent watches the job's keys and reads its own notices from the state
// (its assignment, a reopened round, the job's end). A node's liveness is its lease: its
// "nodes/<id>" key vanishes when keep-alives stop, and any agent that sees that removes it.
// What to write and what a change means is decided by EtcdReducer (etcd_reducer.h); this file
// is the I/O around it.
#include <boost/asio.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "rendezvous/backend/backend.h"
#include "rendezvous/backend/etcd_reducer.h"
#include "rendezvous/base/local_address.h"
#include "rendezvous/base/random.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/etcd_store.h"

namespace ctrun::rendezvous {

namespace asio = boost::asio;

namespace {

using Clock = std::chrono::steady_clock;

// How long one action keeps retrying a write that etcd did not take (members down, no quorum),
// or that lost every race while no other agent's write landed either.
constexpr Duration kWriteTimeout = std::chrono::seconds(30);

// How long an agent that is not among the few to write a change waits for their write before it
// acts itself: the agent of a join request not among the oldest, while the state does not move,
// before it reads the requests again (an agent that is gone leaves its request only until its
// lease runs out); the agent of a member not among the first live ones before it writes a dead
// node's removal. 5 s and a random spread, so that a thousand such agents do not all act at once.
Duration write_patience() {
  static thread_local std::minstd_rand random(std::random_device{}());
  return std::chrono::milliseconds(5000 + random() % 5000);
}

std::int64_t whole_seconds_up(Duration d) {
  const auto ms = to_millis(d);
  return std::max<std::int64_t>(2, (ms + 999) / 1000);  // etcd's shortest lease is about 2 s
}

// One connection to etcd: the options' own, else a gateway Client.
std::unique_ptr<etcd::Kv> connect_kv(asio::io_context& io, const BackendSpec& options,
                                     etcd::ClientOptions client) {
  client.tls = options.access.tls;
  client.user = options.access.user;
  client.password = options.etcd_password;
  if (options.connect_kv) return options.connect_kv(client);
  return std::make_unique<etcd::Client>(io, client);
}

// The I/O half of the etcd backend: reads, watches, writes and timers around an EtcdReducer,
// which decides.
class EtcdRendezvous : public std::enable_shared_from_this<EtcdRendezvous> {
 public:
  using Change = EtcdReducer::Change;

  EtcdRendezvous(asio::io_context& io, BackendSpec options)
      : io_(io),
        options_(std::move(options)),
        job_(options_.job, clock_),
        client_(connect_kv(io, options_, {.endpoints = options_.endpoints})),
        // Keep-alives must not wait out a long request timeout: the lease would be gone first.
        lease_client_(connect_kv(io, options_,
                                 {.endpoints = options_.endpoints,
                                  .request_timeout = options_.lease_ttl / 3,
                                  .attempt_timeout = options_.lease_ttl / 3})),
        store_client_(connect_kv(io, options_, {.endpoints = options_.endpoints})),
        tick_timer_(io),
        removal_timer_(io) {}

  void set_event_handler(Backend::EventHandler handler) { on_event_ = std::move(handler); }
  bool connected() const { return lease_ != 0 && !lost_ && !closed_; }
  const std::string& local_address() const { return local_address_; }
  const std::vector<Endpoint>& endpoints() const { return options_.endpoints; }
  const StoreAccess& access() const { return options_.access; }

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
      co_await sleep_for(backoff);
      backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(2));
    }
    if (local_address_.empty() && !options_.endpoints.empty()) {
      const Endpoint& first = options_.endpoints.front();
      auto address = local_address_towards(first.host, first.port);
      local_address_ = address ? address.value() : "";
    }
    if (!watching_nodes_) {
      watching_nodes_ = true;
      asio::co_spawn(io_, node_watch_loop(shared_from_this()), asio::detached);
    }
    if (!watching_state_) {
      watching_state_ = true;
      asio::co_spawn(io_, state_watch_loop(shared_from_this()), asio::detached);
    }
    while (!job_.loaded()) {
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
    removal_timer_.cancel();
    removal_due_.reset();
    notify();
  }

  Task<Result<RoundAssignment>> join(NodeInfo node, RendezvousConfig config) {
    auto joined = co_await join_round(std::move(node), std::move(config));
    // A request left behind could be taken in by a later write: a node that is not coming.
    if (!joined) co_await drop_join_request();
    co_return joined;
  }

  Task<Result<RoundAssignment>> join_round(NodeInfo node, RendezvousConfig config) {
    job_.set_node(node.node_id);
    job_.begin_join();
    if (auto s = co_await put_node_key(); !s) co_return s.error();
    const std::string request = to_json(JoinRequest{node, config}).dump();
    const Change enter = job_.enter(node, config, EtcdReducer::JoinTurn::kAfterOlder);
    if (auto asked = co_await ask_to_join(request, enter); !asked) co_return asked.error();
    // The answer is in the state once the round forms; each change wakes this.
    using Kind = EtcdReducer::JoinStep::Kind;
    std::int64_t seen_revision = job_.state_revision();
    std::int64_t turn_read_at = seen_revision;  // ask_to_join read the turn
    auto reread_at = Clock::now() + write_patience();
    while (true) {
      if (closed_) co_return Error{ErrorCode::kClosed, "the rendezvous client closed"};
      if (job_.state_revision() != seen_revision) {
        seen_revision = job_.state_revision();
        reread_at = Clock::now() + write_patience();
      }
      auto step = job_.join_step();
      if (!step) co_return step.error();
      const Kind kind = step.value().kind;
      if (kind == Kind::kJoined) co_return step.value().assignment;
      Status done = ok_status();
      if (kind == Kind::kTakeIn) {
        // Waiting to be taken in: the oldest requests' agents write; after each write that
        // lands, and after a while without one (an older request's agent may be gone, its
        // request with its lease), the turn is read again.
        if (turn_read_at != seen_revision || Clock::now() >= reread_at) {
          turn_read_at = seen_revision;
          reread_at = Clock::now() + write_patience();
          done = co_await write_joins_if_turn(enter);
        } else {
          co_await wait_change(std::min(reread_at, Clock::now() + std::chrono::seconds(1)));
        }
      } else if (kind == Kind::kAskAgain) {
        done = co_await ask_to_join(request, enter);
      } else {
        co_await wait_change(Clock::now() + std::chrono::seconds(1));
      }
      if (!done) co_return done.error();
    }
  }

  Task<Result<Json>> resume(std::string node_id) {
    co_await reload_state();
    auto current = job_.view();
    if (!current) co_return current.error();
    const Rendezvous* r = current.value();
    if (!r || !r->has_node(node_id)) {
      co_return Error{ErrorCode::kNotFound,
                      "node '" + node_id + "' is not in job '" + options_.job + "'"};
    }
    Json answer{{"round", r->round()},
                {"formed", r->formed()},
                {"state", std::string(job_state_name(r->state()))}};
    job_.set_node(std::move(node_id));
    if (auto s = co_await put_node_key(); !s) co_return s.error();
    co_return answer;
  }

  Task<Status> report(bool succeeded, std::string message) {
    co_return co_await mutate(job_.report(succeeded, std::move(message)));
  }

  Task<Status> leave() {
    job_.stop_running();
    co_await drop_join_request();
    co_return co_await mutate(job_.leave());
  }

  Task<Status> set(std::string key, std::string value) {
    auto put = co_await client_->put(job_.store_prefix() + key, value);
    co_return put ? ok_status() : Status(put.error());
  }

  // Waits for the key on a watch of its own (store_client_): the state's watch leaves store/
  // out, where the workers' keys come and go; then reads it.
  Task<Result<std::string>> get(std::string key, std::optional<Duration> timeout) {
    while (true) {
      std::vector<std::string> keys{key};
      auto waited =
          co_await etcd::store_wait(*store_client_, job_.store_prefix(), std::move(keys), timeout);
      if (!waited) co_return waited.error();
      auto found = co_await client_->range(job_.store_prefix() + key);
      if (!found) co_return found.error();
      if (!found.value().kvs.empty()) co_return found.value().kvs.front().value;
      if (closed_) co_return Error{ErrorCode::kClosed, "the rendezvous client closed"};
      // Set, then deleted before this read: wait again.
    }
  }

  // The marker (etcd_store.h) is a key of this call's own, on this node's lease.
  Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) {
    co_return co_await etcd::store_add(*client_, job_.store_prefix(), std::move(key), delta,
                                       job_.ops_prefix() + random_hex(8), lease_);
  }

 private:
  // Leaves this node's join request, then writes the state with it (and any others) taken in,
  // unless another agent's write takes it in first.
  Task<Status> ask_to_join(std::string request, Change enter) {
    const std::string key = job_.joins_prefix() + job_.node_id();
    auto put = co_await client_->put(key, request, lease_);
    if (!put) co_return put.error();
    etcd::KeyValue kv;
    kv.key = key;
    kv.value = request;
    kv.mod_revision = put.value();
    kv.lease = lease_;
    job_.own_join_put(std::move(kv));
    co_return co_await write_joins_if_turn(std::move(enter));
  }

  // Reads this join's turn (the few requests older than its own, keys only: a thousand agents
  // reading every request at each write would be most of etcd's work), and when it is among the
  // oldest waiting, every request with its value, then writes them in with this one. A node of
  // the state joining again (a restart) reads and writes at once, as before: its join reopens
  // the round it ran in, whose assignment the cache still holds.
  Task<Status> write_joins_if_turn(Change enter) {
    if (!job_.in_state()) {
      auto turn = co_await client_->txn(job_.turn_request());
      if (!turn || !job_.take_turn(turn.value())) {
        co_await sleep_for(std::chrono::milliseconds(100));
        co_return ok_status();  // the join loop reads again
      }
      if (!job_.writes_joins()) co_return ok_status();  // older requests' agents write it in
    }
    co_await reload_state();
    // Behind older requests after all, `enter` writes nothing.
    co_return co_await mutate(std::move(enter));
  }

  Task<void> drop_join_request() {
    if (job_.node_id().empty() || !job_.own_join_dropped()) co_return;
    (void)co_await client_->erase(job_.joins_prefix() + job_.node_id());
  }

  // Puts this node's key on its lease, taking a new lease when the old one is gone.
  Task<Status> put_node_key() {
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto put =
          co_await client_->put(job_.nodes_prefix() + job_.node_id(), local_address_, lease_);
      if (put) {
        job_.own_node_key_put();
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

  // One consistent read of the state, the live nodes and the join requests; the revision it saw.
  Task<Result<std::int64_t>> load() {
    auto read = co_await client_->txn(job_.load_request());
    if (!read) co_return read.error();
    if (auto s = job_.take_load(read.value()); !s) co_return s.error();
    after_change();
    co_return read.value().revision;
  }

  // The state and the pending join requests, read together (a request is deleted by the write
  // that takes it in, so the two must come from one revision); the revision it saw.
  Task<Result<std::int64_t>> reload() {
    auto read = co_await client_->txn(job_.reload_request());
    if (!read) co_return read.error();
    if (auto s = job_.take_reload(read.value()); !s) co_return s.error();
    after_change();
    co_return read.value().revision;
  }

  Task<void> reload_state() {
    auto read = co_await reload();
    if (!read) co_await sleep_for(std::chrono::milliseconds(100));
  }

  // Two watches, each from a fresh read of its own and read again whenever its stream ends (etcd
  // restarted, a member lost, history compacted), until close(). Neither watches the join
  // requests (read when a write is due) nor store/, where every worker's key goes: N of them
  // heard by N agents would be N^2 messages. For the same reason the node keys are watched for
  // their deletions only: every agent puts its own as it joins.
  Task<void> node_watch_loop([[maybe_unused]] std::shared_ptr<EtcdRendezvous> self) {
    co_await watch_loop(&EtcdRendezvous::load, job_.nodes_prefix(),
                        etcd::prefix_end(job_.nodes_prefix()), etcd::WatchEvents::kDeletesOnly);
    watching_nodes_ = false;  // closed: the next connect() watches again
  }
  Task<void> state_watch_loop([[maybe_unused]] std::shared_ptr<EtcdRendezvous> self) {
    co_await watch_loop(&EtcdRendezvous::reload, job_.state_key(), "", etcd::WatchEvents::kAll);
    watching_state_ = false;
  }
  Task<void> watch_loop(Task<Result<std::int64_t>> (EtcdRendezvous::*read)(), std::string key,
                        std::string range_end, etcd::WatchEvents events) {
    Duration backoff = std::chrono::milliseconds(100);
    while (!closed_) {
      auto revision = co_await (this->*read)();
      if (!revision) {
        if (!closed_) co_await sleep_for(backoff);
        backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(1));
        continue;
      }
      backoff = std::chrono::milliseconds(100);
      (void)co_await client_->watch(
          key, range_end, revision.value() + 1,
          [this](const etcd::WatchMessage& m) {
            if (job_.take_watch(m)) after_change();
          },
          events);
    }
  }

  // What every change of the cache sets off: waiters wake, this node's notices go out, nodes
  // whose leases are gone are removed, and the next deadline is armed.
  void after_change() {
    notify();
    if (closed_) return;
    const auto notice = job_.notice();
    if (notice.event) emit(*notice.event);
    if (notice.lost) lose(*notice.lost);
    arm_tick();
    remove_dead();
  }

  void arm_tick() {
    auto due = job_.next_deadline();
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
      asio::co_spawn(self->io_, self->apply(self, self->job_.tick(), false), asio::detached);
    });
  }

  // The agents of the first live members write a removal at once; the others when it has not
  // landed after their patience (those agents may be gone too).
  void remove_dead() {
    if (removing_) return;
    auto candidates = job_.removable_dead();
    if (candidates.empty()) {
      removal_due_.reset();
      removal_timer_.cancel();
      return;
    }
    if (!job_.writes_removals()) {
      if (!removal_due_) {
        removal_due_ = Clock::now() + write_patience();
        removal_timer_.expires_at(*removal_due_);
        removal_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
          auto self = weak.lock();
          if (!ec && self && !self->closed_) self->remove_dead();
        });
      }
      if (Clock::now() < *removal_due_) return;
    }
    removal_due_.reset();
    removing_ = true;
    asio::co_spawn(io_, remove_confirmed_dead(shared_from_this(), std::move(candidates)),
                   asio::detached);
  }

  // The watch hears node keys go but not come back (a node that lost its lease and joins again
  // on a new one): their keys are read before they are removed.
  Task<void> remove_confirmed_dead(std::shared_ptr<EtcdRendezvous> self,
                                   std::vector<std::string> candidates) {
    auto read = co_await client_->txn(job_.node_keys_request(candidates));
    if (!read || !job_.take_node_keys(candidates, read.value())) {
      co_await sleep_for(std::chrono::seconds(1));  // etcd unreachable: not a busy loop
      removing_ = false;
      after_change();
      co_return;
    }
    auto gone = job_.removable_dead();
    if (gone.empty() || closed_) {
      removing_ = false;
      co_return;
    }
    const std::string why = "its etcd lease expired (no keep-alive for " +
                            std::to_string(whole_seconds_up(options_.lease_ttl)) + " s)";
    co_await apply(std::move(self), job_.remove(std::move(gone), why), true);
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
    auto until = Clock::now() + kWriteTimeout;
    int lost = 0;
    while (true) {
      if (closed_) co_return Error{ErrorCode::kClosed, "the rendezvous client closed"};
      auto planned = job_.plan(change);
      if (planned && planned.value().needs_restart_counter) {
        auto counter = co_await client_->range(job_.store_prefix() + kRestartsKey);
        if (!counter) co_return counter.error();
        EtcdReducer::RestartCounter read;
        if (!counter.value().kvs.empty()) {
          read.value = counter_value(counter.value().kvs.front().value, 0);
          read.mod_revision = counter.value().kvs.front().mod_revision;
        }
        // The cache may have moved while the counter was read: plan anew on it.
        planned = job_.plan(change, read);
      }
      if (!planned) co_return planned.error();
      if (!planned.value().write) co_return ok_status();
      const EtcdReducer::Write write = std::move(*planned.value().write);
      const std::int64_t planned_on = job_.state_revision();
      auto written = co_await client_->txn(write.txn);
      if (written && written.value().succeeded) {
        job_.written(write, written.value().revision);
        tell(write);
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
      // retry lost to it: read the state again. Our own write is done; anything else gets the
      // change applied anew. Many agents racing back off a random while, growing with each
      // loss: the winner's write may take their joins in.
      co_await sleep_for(etcd::contention_backoff(++lost));
      co_await reload_state();
      // Another agent's write landed: the job moves on, and a join waits its turn (the oldest
      // requests are taken in first), however many nodes join at once.
      if (written && job_.state_revision() > planned_on) until = Clock::now() + kWriteTimeout;
      if (job_.holds(write)) {
        if (options_.log) {
          for (const auto& line : write.lines) options_.log(line);
        }
        after_change();
        co_return ok_status();
      }
    }
  }

  // The log lines and events of a write that landed.
  void tell(const EtcdReducer::Write& write) {
    if (options_.log) {
      for (const auto& line : write.lines) options_.log(line);
    }
    if (options_.events) {
      for (const auto& [name, fields] : write.events) options_.events(name, fields);
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
      co_await sleep_for(keep_alive_interval_);
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
  BackendSpec options_;
  SteadyClock clock_;
  EtcdReducer job_;
  std::unique_ptr<etcd::Kv> client_;
  std::unique_ptr<etcd::Kv> lease_client_;
  std::unique_ptr<etcd::Kv> store_client_;  // store gets: their watches end by cancelling all of it
  asio::steady_timer tick_timer_;
  std::optional<Clock::time_point> tick_at_;  // when tick_timer_ fires, while armed
  asio::steady_timer removal_timer_;
  std::optional<Clock::time_point> removal_due_;  // when a non-writer writes a removal itself
  Backend::EventHandler on_event_;
  std::string local_address_;
  std::vector<asio::steady_timer*> waiters_;

  bool closed_ = false;
  bool watching_nodes_ = false;
  bool watching_state_ = false;
  bool removing_ = false;
  std::int64_t lease_ = 0;
  bool lost_ = false;
  int keep_alive_epoch_ = 0;
  Duration keep_alive_interval_{};  // zero until start_keep_alive()
};

class EtcdBackend final : public Backend {
 public:
  EtcdBackend(asio::io_context& io, BackendSpec options)
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
    return etcd_store_address(impl_->endpoints(), prefix, impl_->access());
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
  void drop_connections() override { impl_->close(); }
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

std::unique_ptr<Backend> make_etcd_backend(asio::io_context& io, BackendSpec options) {
  return std::make_unique<EtcdBackend>(io, std::move(options));
}

}  // namespace ctrun::rendezvous
