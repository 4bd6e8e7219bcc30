// The decisions of the etcd backend, without etcd: what one agent knows of its job's keys (a
// cache fed by its reads and its watch), the writes it makes of a change (the Rendezvous call
// ctrund would make, as one compare-and-swap transaction), and what it concludes after each
// change (its notices, its join's progress, the dead nodes to remove, the next deadline).
// etcd_backend.cc does the I/O around it; tests drive it with KeyValues by hand.
//
// The keys of a job (under etcd_job_prefix): "rendezvous" (Rendezvous::save(), state_value.h),
// "nodes/<id>" (a node's liveness, on its lease), "joins/<id>" (a join request waiting for the
// next write to take it in), "store/" (the c10d store) and "ops/" (the store's add markers).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/json.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/core/rendezvous.h"
#include "rendezvous/etcd/etcd.h"

namespace ctrun::rendezvous {

// Under contention one write takes in every join request it sees, up to this many (a compare
// and a delete each; etcd allows 128 operations in a transaction).
inline constexpr std::size_t kJoinsPerWrite = 120;
// How many agents write join requests in at once: those of the oldest requests still waiting.
// The others wait for those writes, which take the oldest in first: a thousand agents racing
// for the one key would each lose, re-read and write again after every write that lands.
inline constexpr std::size_t kJoinWriters = 3;
// How many agents write the removal of a node whose lease is gone at once: those of the first
// live members in the state's order. The others wait a while for that write: all of a large job
// writing it would each lose the race, re-read and find nothing left to do.
inline constexpr std::size_t kRemovalWriters = 3;
// Node keys read in one transaction (etcd's default --max-txn-ops).
inline constexpr std::size_t kNodeKeysPerRead = 128;

class EtcdReducer {
 public:
  EtcdReducer(std::string job, const Clock& clock);

  const std::string& job() const { return job_; }
  const std::string& state_key() const { return state_key_; }
  const std::string& nodes_prefix() const { return nodes_prefix_; }
  const std::string& joins_prefix() const { return joins_prefix_; }
  const std::string& store_prefix() const { return store_prefix_; }
  const std::string& ops_prefix() const { return ops_prefix_; }

  // This agent's node; its keys are nodes/<id> and joins/<id>.
  void set_node(std::string node_id) { node_id_ = std::move(node_id); }
  const std::string& node_id() const { return node_id_; }

  // --- The cache ---
  // The reads that fill it, each from one revision: `load` is the state, nodes/ and joins/ (in
  // that order: load_request()), `reload` the state and joins/ (reload_request()). A read older
  // than what the cache holds changes nothing.
  etcd::Txn load_request() const;
  etcd::Txn reload_request() const;
  Status take_load(const etcd::TxnResult& read);
  Status take_reload(const etcd::TxnResult& read);
  // A waiting join's turn, read without the requests' values: the keys of up to kJoinWriters
  // requests older than this node's own (needs own_join_put() first). Fresher than the cached
  // requests, it decides writes_joins() until the next reload.
  etcd::Txn turn_request() const;
  Status take_turn(const etcd::TxnResult& read);
  // The state key's changes and the node keys' deletions, as the two watches bring them; whether
  // anything this agent acts on changed. Node keys' puts are not watched (N agents would each
  // hear N of them): a node whose key came back after it was seen to go is counted gone until a
  // read says otherwise (node_keys_request(), before a removal).
  bool take_watch(const etcd::WatchMessage& message);
  // A read of the node keys of `ids` (at most kNodeKeysPerRead of them, the first), and what it
  // found: a key there is a node alive, unless a deletion newer than the read was heard since.
  etcd::Txn node_keys_request(const std::vector<std::string>& ids) const;
  Status take_node_keys(const std::vector<std::string>& ids, const etcd::TxnResult& read);
  bool loaded() const { return loaded_; }
  // This node's key was put (it is alive), its join request put as `request`, or withdrawn.
  void own_node_key_put();
  void own_join_put(etcd::KeyValue request);
  // Whether there was one to withdraw.
  bool own_join_dropped();
  // The state as cached, restored (null when the key does not exist); good until the cache
  // next changes.
  Result<const Rendezvous*> view();
  // The revision of the cached state: another agent's write landing moves it.
  std::int64_t state_revision() const { return state_rev_; }

  // --- Writes ---
  // What a change may do: replace the Rendezvous (a new job under the same id), add operations
  // to the write and conditions to its compare-and-swap. `log` and `events` are what a
  // Rendezvous it creates should use. `applied` lists the join requests it took in.
  struct Edit {
    std::unique_ptr<Rendezvous>& state;
    std::vector<etcd::Operation>& also;
    std::vector<etcd::Compare>& checks;
    std::vector<std::string>& applied;
    Rendezvous::Logger log;
    EventSink events;
  };
  using Change = std::function<Status(Edit&)>;

  // The job's restart counter (store/ctrun/restarts) as read for a write that forms a round.
  struct RestartCounter {
    long long value = 0;
    std::int64_t mod_revision = 0;  // 0: the key does not exist
  };
  // One write: the transaction, and what it tells once it lands.
  struct Write {
    etcd::Txn txn;
    std::string text;  // the state it writes, as the key's value (etcd/state_value.h)
    std::vector<std::string> lines;
    std::vector<std::pair<std::string, Json>> events;
    std::vector<std::string> applied;
  };
  struct Plan {
    std::optional<Write> write;  // nullopt: the change changes nothing
    // The change forms a round of the running job: plan again with the counter read.
    bool needs_restart_counter = false;
  };
  // What `change` makes of the cached state.
  Result<Plan> plan(const Change& change, std::optional<RestartCounter> counter = {}) const;
  // The write landed at `revision`: the cache takes it (and forgets the requests it took in).
  void written(const Write& write, std::int64_t revision);
  // After a lost race and a re-read: whether the state is this very write (a try cut short
  // that landed before its retry lost to it). Its save time makes a write unique.
  bool holds(const Write& write) const;

  // The changes, as ctrund would make them for this node. `enter` takes in this node's pending
  // request with the others it sees; once its own is in, it writes nothing. With kAfterOlder it
  // also writes nothing while kJoinWriters older requests wait in the running job (their agents'
  // writes take this one in), as the agents' joins use it; kNow writes regardless.
  enum class JoinTurn { kNow, kAfterOlder };
  Change enter(const NodeInfo& node, const RendezvousConfig& config,
               JoinTurn turn = JoinTurn::kNow) const;
  // Whether this node's request waits and is its agent's to write now: among the kJoinWriters
  // oldest still waiting (as far as the cache knows: a request the cached state has taken in
  // waits no more; with no running job, the oldest start it).
  bool writes_joins();
  // Whether this node is in the cached state (a member joining again, or one taken in).
  bool in_state();
  Change report(bool succeeded, std::string message) const;
  Change leave() const;
  Change tick() const;
  Change remove(std::vector<std::string> nodes, std::string why) const;

  // --- Conclusions ---
  // Where this node's join stands after its request went in.
  struct JoinStep {
    enum class Kind {
      kJoined,    // `assignment` is this node's place in the formed round
      kTakeIn,    // its request is not in the state yet: write it in
      kAskAgain,  // its round formed and reopened before it read the state: join the next
      kWait,      // joining: wait for the next change
    };
    Kind kind = Kind::kWait;
    RoundAssignment assignment{};
  };
  // A join begins: until it returns this node runs in no round, and hears no notices.
  void begin_join();
  // kJoined also records the round this node now runs in.
  Result<JoinStep> join_step();
  // This node left its round.
  void stop_running() { running_round_.reset(); }

  // What this node is told after a change: a reopened round or the job's end (each once), or
  // its removal by another node (`lost`, the reason).
  struct Notice {
    std::optional<BackendEvent> event;
    std::optional<std::string> lost;
  };
  Notice notice();
  // Nodes whose keys are gone and whose removal would change the state: a write to remove them
  // is due (remove()).
  std::vector<std::string> removable_dead();
  // Whether this agent writes that removal at once: its node is among the kRemovalWriters first
  // members of the state that are alive as far as the cache knows.
  bool writes_removals();
  // When a tick() is next due.
  std::optional<TimePoint> next_deadline();

 private:
  Result<std::unique_ptr<Rendezvous>> restore_current(Rendezvous::Logger log = {}) const;
  void take_state(const etcd::KeyValue* kv, std::int64_t revision);
  void take_joins(const std::vector<etcd::KeyValue>& kvs, std::int64_t revision);
  Status take_in_joins(Edit& edit) const;
  bool any_live_peer(const Rendezvous& r) const;
  // Whether kJoinWriters older requests wait to be taken into `r` (nullptr: into a job not
  // started yet).
  bool behind_older_requests(const Rendezvous* r) const;

  const std::string job_;
  const Clock& clock_;
  const std::string prefix_;
  const std::string state_key_;
  const std::string nodes_prefix_;
  const std::string joins_prefix_;
  const std::string store_prefix_;
  const std::string ops_prefix_;
  std::string node_id_;

  // The state (null: no key; discarded: not ours) at state_rev_, and the nodes whose keys exist
  // (live_) or were seen to go (dead_, with the revision at which they were seen gone).
  bool loaded_ = false;
  Json state_json_;
  std::string unreadable_state_;  // why, when state_json_ is discarded
  std::int64_t state_rev_ = 0;
  std::unique_ptr<Rendezvous> view_;  // state_json_ restored, while view_ok_
  bool view_ok_ = false;
  std::set<std::string> live_;
  std::map<std::string, std::int64_t> dead_;
  // Join requests not taken in yet (joins/<id>) as the last read saw them, at joins_rev_.
  std::map<std::string, etcd::KeyValue> joins_;
  std::int64_t joins_rev_ = 0;

  // writes_joins()'s answer, kept while the state and the requests it was drawn from stay: an
  // agent asks on every change it hears of, and the answer reads every request.
  struct WritesJoinsMemo {
    std::int64_t state_rev = -1;
    std::int64_t joins_rev = -1;
    std::int64_t own_rev = -1;
    std::int64_t older_rev = -1;
    bool writes = false;
  };
  WritesJoinsMemo writes_joins_memo_;
  // take_turn()'s answer: the ids of the requests older than this node's (at most
  // kJoinWriters), read at older_rev_.
  std::vector<std::string> older_ids_;
  std::int64_t older_rev_ = 0;

  std::optional<int> running_round_;  // the round this node runs in, after its join returned
  int reported_round_ = 0;            // the newest round this node knows of
  bool end_sent_ = false;
};

}  // namespace ctrun::rendezvous
