// The Service's insides: its operations, and what it keeps per connection and per job. Private to
// the Service's files: service.cc (ctrund's protocol, jobs, the journal), service_tcpstore.cc
// (torch's TCPStore wire) and service_quorum.cc (the per-step quorum); service.h forwards to it.
// Concerns of their own are objects beside it: ConnectionLimits (who is admitted),
// DelayedAnswers (an injected store latency) and ServiceJournal (--state_dir's records).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rendezvous/core/quorum.h"
#include "rendezvous/protocol/fault_keys.h"
#include "rendezvous/protocol/tcpstore_wire.h"
#include "rendezvous/service/connection_limits.h"
#include "rendezvous/service/delayed_answers.h"
#include "rendezvous/service/service.h"
#include "rendezvous/service/service_journal.h"

namespace ctrun::rendezvous {

class Service::Impl {
 public:
  Impl(ServiceOptions options, const Clock& clock, Transport& transport);

  // Rebuilds the jobs recorded in options.state (call once, before the first connection). Each
  // restored node gets a fresh keep-alive window to come back and `resume` on a new connection.
  Status restore();

  // The daemon is going away (SIGTERM, Server::stop): the connections it closes now do not
  // take their nodes out of the rendezvous, so a daemon restarted from --state_dir finds them.
  void shutdown() { shutting_down_ = true; }

  // `worker_store_job`: the connection came to that job's own worker-store port and speaks
  // torch's TCPStore wire from its first byte.
  void on_connect(ConnectionId id, std::string peer,
                  std::optional<std::string> worker_store_job = std::nullopt);
  void on_data(ConnectionId id, const char* data, std::size_t size);
  void on_disconnect(ConnectionId id);
  // Applies every deadline: store waits, rendezvous timers, slow or silent connections.
  void tick();

  // Counters since start and the jobs as they are now (ctrund --metrics_port).
  ServiceMetrics metrics() const;

  struct Connection;
  struct Job;
  using Handler = void (Impl::*)(Connection&, std::uint64_t, const Json&);

  void log(const std::string& line) const;
  // Connection limits (limits_ decides): ctrun's protocol refused with an error frame; torch's
  // TCPStore clients by a close before any byte (all torch's client understands).
  bool admit_ctrund(ConnectionId id, const std::string& peer);
  bool admit_tcpstore(Job& job, const std::string& peer);
  std::size_t worker_store_limit(Job* job);  // null: a job not seen yet
  // Ranks of every node the job's rendezvous knows (0 without one), cached by its revision;
  // says once per size when the open-file limit cannot serve them.
  std::size_t job_ranks(Job& job);
  Job& job_named(const std::string& name);
  void handle_frame(Connection& c, Json frame);
  void reply(const Connection& c, std::uint64_t id, Json body);
  void fail(const Connection& c, std::uint64_t id, const Error& e);
  // Sends an error and closes: for protocol violations.
  void reject(Connection& c, std::uint64_t id, const Error& e);
  void drop(ConnectionId id, const std::string& why);
  // Sends each notice to its node; `acknowledged`: the caller answers a request about the
  // change, so it is recorded (--state_dir) even when no notice goes out.
  void deliver(Job& job, std::vector<Notice> notices, bool acknowledged = true);
  void close_dropped_nodes(Job& job);
  Job& job_of(Connection& c);
  void gc_jobs();

  void op_hello(Connection& c, std::uint64_t id, const Json& req);
  void op_ping(Connection& c, std::uint64_t id, const Json& req);
  void op_set(Connection& c, std::uint64_t id, const Json& req);
  void op_get(Connection& c, std::uint64_t id, const Json& req);
  void op_add(Connection& c, std::uint64_t id, const Json& req);
  void op_compare_set(Connection& c, std::uint64_t id, const Json& req);
  void op_check(Connection& c, std::uint64_t id, const Json& req);
  void op_wait(Connection& c, std::uint64_t id, const Json& req);
  void op_delete(Connection& c, std::uint64_t id, const Json& req);
  void op_num_keys(Connection& c, std::uint64_t id, const Json& req);
  void op_multi_get(Connection& c, std::uint64_t id, const Json& req);
  void op_multi_set(Connection& c, std::uint64_t id, const Json& req);
  void op_join(Connection& c, std::uint64_t id, const Json& req);
  void op_leave(Connection& c, std::uint64_t id, const Json& req);
  void op_keep_alive(Connection& c, std::uint64_t id, const Json& req);
  void op_report(Connection& c, std::uint64_t id, const Json& req);
  void op_close(Connection& c, std::uint64_t id, const Json& req);
  void op_resume(Connection& c, std::uint64_t id, const Json& req);
  void op_status(Connection& c, std::uint64_t id, const Json& req);
  void op_jobs(Connection& c, std::uint64_t id, const Json& req);
  // The per-step quorum of a fault-tolerant job (service_quorum.cc).
  void op_quorum(Connection& c, std::uint64_t id, const Json& req);
  void op_quorum_heartbeat(Connection& c, std::uint64_t id, const Json& req);
  void deliver_quorum(Job& job, std::vector<QuorumNotice> notices);
  // The connection that asked for `replicas` is gone: so are they.
  void drop_replicas(Job& job, const Connection& c);
  // --state_dir (journal_): a record per change, written before the change is acknowledged.
  void record_key(const std::string& job, const std::string& key);
  void record_rendezvous(Job& job);
  Status apply_record(const Json& r);
  // Every job's keys and rendezvous as records: the whole state, for a snapshot.
  std::vector<Json> snapshot_records() const;
  // Binds a node to the connection that now speaks for it, superseding an older binding.
  void bind_node(Connection& c, Job& job, const std::string& node);
  // get, wait and multi_get: answer when every key exists, or time out.
  void wait_for_keys(Connection& c, std::uint64_t id, const Json& req, bool with_values);
  void send_challenge(const Connection& c);
  // Every frame or TCPStore answer to a connection goes through here: at once, or, while its
  // job has an injected store latency (kStoreLatencyKey), held until due (answers_).
  void send_to(ConnectionId id, std::string bytes);
  // The job's store was set kStoreLatencyKey: {"ms", "seconds"} from now.
  void start_store_latency(Job& job, const std::string& value);

  // torch's TCPStore wire (service_tcpstore.cc).
  void start_tcpstore(Connection& c, const std::string& job);
  void on_tcpstore_data(Connection& c, const char* data, std::size_t size);
  void handle_tcpstore(Connection& c, tcpstore::Request& req);
  void tcpstore_wait(Connection& c, std::vector<std::string> keys);
  void tcpstore_barrier(Connection& c, const std::string& key, std::int64_t world_size);
  void tcpstore_watch(Connection& c, const std::string& key);
  // Drops what the connection waits for (waits, barriers) and, unless kept, its watches.
  void end_tcpstore(Connection& c, bool keep_watches);
  // The keys of a round no TCPStore connection is bound to any more, when a later round is the
  // job's: nothing can read them (new connections bind to the job's round), so they go, and a
  // job's store stays bounded across any number of restarts.
  void drop_stale_rounds(Job& job);
  // Where a TCPStore connection opened now keeps its keys: the job's round, as torch keeps a
  // fresh store per round.
  static std::string current_prefix(const Job& job);

  ServiceOptions options_;
  const Clock& clock_;
  Transport& transport_;
  std::unordered_map<ConnectionId, std::unique_ptr<Connection>> connections_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  ServiceMetrics counters_;  // the counter fields only; requests are counted apart
  std::unordered_map<std::string_view, std::uint64_t> request_counts_;   // keys: kHandlers'
  std::unordered_map<std::string_view, std::uint64_t> tcpstore_counts_;  // keys: op_name()
  DelayedAnswers answers_;  // what an injected store latency holds back
  ConnectionLimits limits_;
  ServiceJournal journal_;
  bool shutting_down_ = false;  // shutdown(): closed connections keep their nodes
  static const std::unordered_map<std::string_view, Handler> kHandlers;
};

// Which protocol a connection speaks. A listener that also serves the worker store tells them
// apart by the first bytes: ctrun's clients open with kClientPreamble, torch's TCPStore clients
// with a command.
enum class Wire { kUndecided, kCtrund, kTcpStore };

struct Service::Impl::Connection {
  ConnectionId id = 0;
  std::string peer;
  Wire wire = Wire::kUndecided;
  bool opened = false;  // its first bytes were seen (and a preamble passed over)
  std::string opening;  // the first bytes, while they may still be the preamble
  FrameDecoder decoder;
  TimePoint opened_at;
  std::optional<TimePoint> mid_frame_since;
  std::string nonce;
  bool authenticated = false;
  std::string job;   // after hello; for a TCPStore connection, the worker-store job
  std::string node;  // the rendezvous node this connection speaks for, once it joined
  std::optional<std::uint64_t> join_request;
  std::unordered_set<KeyValueStore::WaiterId> waiters;
  // TCPStore connections: every key lives under this prefix of the job's store (the round's,
  // when the connection opened), and the requests are decoded here.
  std::string key_prefix;
  std::unique_ptr<tcpstore::Decoder> tcpstore;
  std::set<std::string> barriers;  // full keys of the barriers it waits at
  std::set<std::string> watches;   // full keys it watches (torch <= 2.0)
  std::set<std::string> replicas;  // the quorum replicas it asked for
};

struct Service::Impl::Job {
  Job(std::string job_name, const StoreLimits& limits) : name(std::move(job_name)), store(limits) {}
  std::string name;
  KeyValueStore store;
  std::unique_ptr<Rendezvous> rendezvous;
  int generation = 0;
  std::unordered_map<std::string, ConnectionId> node_connections;
  std::size_t connections = 0;
  std::size_t tcpstore_connections = 0;  // of those, torch's TCPStore clients
  TimePoint idle_since;
  // job_ranks()'s cache: the rendezvous and revision it was counted at; the size last warned of.
  const Rendezvous* ranks_of = nullptr;
  std::uint64_t ranks_revision = 0;
  std::size_t ranks = 0;
  std::size_t ranks_warned = 0;
  // What was last recorded of the rendezvous (--state_dir).
  const Rendezvous* saved_rendezvous = nullptr;
  std::uint64_t saved_revision = 0;
  // Which numbering its TCPStore clients without VALIDATE speak (1.13/2.0 or 2.1), once one of
  // them told: the others are read in it (every rank of a job runs one torch).
  tcpstore::Dialect unvalidated_dialect = tcpstore::Dialect::kUndecided;
  // The key prefixes (rounds) TCPStore connections were bound to, with how many still are.
  std::map<std::string, std::size_t> tcpstore_prefixes;
  // TCPStore barriers: the connections waiting at each full key.
  std::map<std::string, std::vector<ConnectionId>> barrier_waiters;
  // TCPStore watches (torch <= 2.0): the connections told of each full key's changes.
  std::map<std::string, std::set<ConnectionId>> watchers;
  // ServiceOptions::worker_store_per_job: the port the Transport listens on for this job's
  // TCPStore clients; 0 while none.
  std::uint16_t worker_store_port = 0;
  // --fault_tolerance=step: the per-step quorum, made at the first ask; each replica's pending
  // ask (connection, request id) and the connection that speaks for it.
  std::unique_ptr<Quorum> quorum;
  std::map<std::string, std::pair<ConnectionId, std::uint64_t>> quorum_asks;
  std::map<std::string, ConnectionId> replica_connections;
  // An injected store latency (ctrun --faults store_latency): answers are `answer_delay` late
  // until `answer_delay_until`.
  Duration answer_delay{};
  TimePoint answer_delay_until{};
};

}  // namespace ctrun::rendezvous
