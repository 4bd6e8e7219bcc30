// ctrund --state_dir as the service writes it: one record per change (a job's key set or
// deleted, its rendezvous, the job dropped), appended before the change is acknowledged. After
// a failed append later records would not add up, so the whole state is rewritten at the next
// tick, as it is when the journal outgrows both compact_bytes and the snapshot. One definition
// of each record ("t": set, del, rdzv, drop) for writing and for replay. Over the StateLog seam
// (core/state_log.h): tested with one in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "rendezvous/core/state_log.h"

namespace ctrun::rendezvous {

// A record as replay reads it.
struct JobRecord {
  enum class Kind { kSet, kDelete, kRendezvous, kDrop };
  Kind kind = Kind::kSet;
  std::string job;
  std::string key;     // kSet, kDelete
  std::string value;   // kSet
  int generation = 0;  // kRendezvous: the job's rendezvous generation
  Json state;          // kRendezvous: Rendezvous::save(), null for none
};

// The records, written.
Json set_record(const std::string& job, const std::string& key, const std::string& value);
Json delete_record(const std::string& job, const std::string& key);
Json rendezvous_record(const std::string& job, int generation, Json state);
Json drop_record(const std::string& job);
// And read back: an error naming what is wrong with it.
Result<JobRecord> decode_job_record(const Json& record);

class ServiceJournal {
 public:
  using Log = std::function<void(const std::string& line)>;

  // `state` null: no --state_dir, and every call does nothing.
  ServiceJournal(StateLog* state, std::uint64_t compact_bytes, Log log)
      : state_(state), compact_bytes_(compact_bytes), log_(std::move(log)) {}

  bool on() const { return state_ != nullptr; }
  // A change, recorded (see set_record() and the others).
  void append(const Json& record);
  // At each tick: the whole state rewritten from `snapshot()` when that is due, then the journal
  // flushed to the disk.
  void tick(const std::function<std::vector<Json>()>& snapshot);
  // Makes `records` the whole state now; false when it cannot.
  bool rewrite(const std::vector<Json>& records);
  // Every record so far, oldest first, and what reading them had to repair (or empty).
  Result<std::vector<Json>> load();
  std::string load_note() const { return state_ ? state_->load_note() : std::string(); }

 private:
  StateLog* state_;
  std::uint64_t compact_bytes_;
  Log log_;
  bool broken_ = false;  // an append failed: rewrite everything at the next tick
};

}  // namespace ctrun::rendezvous
