// ctrund's `quorum` and `quorum_heartbeat` ops: the per-step quorum of a fault-tolerant job
// (core/quorum.h decides; this file binds replicas to connections and delivers answers).
#include "rendezvous/base/random.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/service/service_impl.h"

namespace ctrun::rendezvous {

namespace {

// max_replicas is left out: it only decides when the first quorum forms, and a replica started
// in a later round of an elastic job sees another world size.
bool same(const QuorumConfig& a, const QuorumConfig& b) {
  return a.min_replicas == b.min_replicas && a.join_timeout == b.join_timeout &&
         a.heartbeat_timeout == b.heartbeat_timeout;
}

std::string describe(const QuorumConfig& c) {
  return "min_replicas " + std::to_string(c.min_replicas) + ", max_replicas " +
         std::to_string(c.max_replicas) + ", join timeout " +
         std::to_string(to_millis(c.join_timeout)) + " ms, heartbeat timeout " +
         std::to_string(to_millis(c.heartbeat_timeout)) + " ms";
}

}  // namespace

void Service::Impl::op_quorum(Connection& c, std::uint64_t id, const Json& req) {
  auto request = quorum_request_from_json(req);
  if (!request) return reject(c, id, request.error());
  const QuorumMember& member = request.value().member;
  const QuorumConfig& config = request.value().config;
  if (auto s = validate(config); !s) return fail(c, id, s.error());
  Job& job = job_of(c);
  if (!job.quorum) {
    // A root of its own per Quorum: after a daemon restart quorum ids start again at 1, and
    // must not meet in the keys the old quorum 1 left in the restored store.
    job.quorum = std::make_unique<Quorum>(config, clock_, "quorum/" + random_hex(4) + "/");
  } else if (!same(job.quorum->config(), config)) {
    return fail(c, id,
                Error{ErrorCode::kConflict, "job '" + c.job + "' runs its quorum with " +
                                                describe(job.quorum->config()) +
                                                "; this replica asked for " + describe(config)});
  }
  // A newer ask of the replica (a replacement, a reconnect) supersedes the pending one.
  if (auto pending = job.quorum_asks.find(member.replica_id); pending != job.quorum_asks.end()) {
    auto older = connections_.find(pending->second.first);
    if (older != connections_.end()) {
      fail(*older->second, pending->second.second,
           Error{ErrorCode::kConflict,
                 "superseded by a newer quorum ask of replica '" + member.replica_id + "'"});
    }
    job.quorum_asks.erase(pending);
  }
  job.quorum_asks[member.replica_id] = {c.id, id};
  job.replica_connections[member.replica_id] = c.id;
  c.replicas.insert(member.replica_id);
  deliver_quorum(job, request.value().finished ? job.quorum->finish(member)
                                               : job.quorum->ask(member, request.value().rebuild));
}

void Service::Impl::op_quorum_heartbeat(Connection& c, std::uint64_t id, const Json& req) {
  auto replica = get_string(req, "replica");
  if (!replica) return reject(c, id, replica.error());
  Job& job = job_of(c);
  if (!job.quorum) {
    return fail(c, id, Error{ErrorCode::kNotFound, "job '" + c.job + "' has no quorum"});
  }
  // Only for a replica this connection asked for: a heartbeat must not revive one that left.
  auto bound = job.replica_connections.find(replica.value());
  if (bound == job.replica_connections.end() || bound->second != c.id) {
    return fail(c, id,
                Error{ErrorCode::kNotFound,
                      "this connection does not speak for replica '" + replica.value() + "'"});
  }
  job.quorum->heartbeat(replica.value());
  reply(c, id, Json::object());
}

void Service::Impl::deliver_quorum(Job& job, std::vector<QuorumNotice> notices) {
  for (auto& notice : notices) {
    auto pending = job.quorum_asks.find(notice.replica_id);
    if (pending == job.quorum_asks.end()) continue;
    const auto [cid, request] = pending->second;
    job.quorum_asks.erase(pending);
    auto it = connections_.find(cid);
    if (it != connections_.end()) reply(*it->second, request, to_json(notice.assignment));
  }
}

void Service::Impl::drop_replicas(Job& job, const Connection& c) {
  if (!job.quorum) return;
  for (const auto& replica : c.replicas) {
    auto bound = job.replica_connections.find(replica);
    if (bound == job.replica_connections.end() || bound->second != c.id) continue;
    job.replica_connections.erase(bound);
    job.quorum_asks.erase(replica);
    log("job '" + job.name + "': quorum replica '" + replica + "' gone (its connection closed)");
    deliver_quorum(job, job.quorum->remove(replica));
  }
}

}  // namespace ctrun::rendezvous
