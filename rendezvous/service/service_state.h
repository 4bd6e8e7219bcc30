// What the Service keeps per connection and per job. Private to the Service's files: service.cc
// (ctrund's protocol, jobs, the journal) and service_tcpstore.cc (torch's TCPStore wire).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rendezvous/protocol/tcpstore_wire.h"
#include "rendezvous/service/service.h"

namespace ctrun::rendezvous {

// Which protocol a connection speaks. A listener that also serves the worker store tells them
// apart by the first bytes: ctrun's clients open with kClientPreamble, torch's TCPStore clients
// with a command.
enum class Wire { kUndecided, kCtrund, kTcpStore };

struct Service::Connection {
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
};

struct Service::Job {
  Job(std::string job_name, const StoreLimits& limits) : name(std::move(job_name)), store(limits) {}
  std::string name;
  KeyValueStore store;
  std::unique_ptr<Rendezvous> rendezvous;
  int generation = 0;
  std::unordered_map<std::string, ConnectionId> node_connections;
  std::size_t connections = 0;
  TimePoint idle_since;
  // What was last recorded of the rendezvous (--state_dir).
  const Rendezvous* saved_rendezvous = nullptr;
  std::uint64_t saved_revision = 0;
  // TCPStore barriers: the connections waiting at each full key.
  std::map<std::string, std::vector<ConnectionId>> barrier_waiters;
  // TCPStore watches (torch <= 2.0): the connections told of each full key's changes.
  std::map<std::string, std::set<ConnectionId>> watchers;
  // ServiceOptions::worker_store_per_job: the port the Transport listens on for this job's
  // TCPStore clients; 0 while none.
  std::uint16_t worker_store_port = 0;
};

}  // namespace ctrun::rendezvous
