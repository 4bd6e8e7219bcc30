// Jobs on etcd as ctrun lays them out, and what `ctrun status` shows of them. Every key of job J
// is under "/ctrun/<J>/" (J with '%' and '/' escaped as %25 and %2F, so one job's keys are never
// inside another's): "rendezvous" (the Rendezvous, saved: state_value.h), "nodes/<id>" (on each
// node's lease), "joins/<id>" (joins not taken in yet, on the joiner's lease), "store/<key>",
// "ops/<random>" (store add markers), and, for --fault_tolerance=step, "quorum/state" and
// "quorum/alive/<replica>" (the replicas' per-step quorum, etcd_quorum.h).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ctrun/rendezvous/json.h"
#include "rendezvous/core/rendezvous.h"
#include "rendezvous/etcd/kv.h"

namespace ctrun::rendezvous {

std::string etcd_job_prefix(const std::string& job);
// The job a key belongs to, or nullopt for a key outside the layout.
std::optional<std::string> etcd_job_of_key(const std::string& key);

// A job's rendezvous as its "rendezvous" key holds it, deadlines carried (Timers::kCarried).
Result<std::unique_ptr<Rendezvous>> etcd_restore_state(const etcd::KeyValue& kv,
                                                       const Clock& clock);

// One job in the shape of ctrund's `status` answer: {"job", "keys", "restarts", "max_restarts"
// (-1 when unset), "connections" (nodes holding a lease), "rendezvous": Rendezvous::describe()},
// where a node's "last_seen_ms_ago" is the time since its lease was last renewed (-1: its key is
// gone); "last_fault" and "steps" (the straggler verdict, step_keys.h) where the store has them.
etcd::Task<Result<Json>> etcd_job_status(etcd::Kv& client, std::string job);
// Every job, in the shape of ctrund's `jobs` answer: {"jobs": [{"job", "state", "round",
// "nodes", "restarts", "connections", "keys"}]}.
etcd::Task<Result<Json>> etcd_jobs(etcd::Kv& client);

}  // namespace ctrun::rendezvous
