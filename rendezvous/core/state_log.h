// Where ctrund keeps its state between runs (--state_dir): every job's store keys and
// rendezvous, as a sequence of records. The Service appends a record before it acknowledges the
// change it describes and, when the journal has grown, rewrites the whole state as a snapshot.
//
// Records (MessagePack maps, newest last; replaying them in order rebuilds the state, and
// replaying a journal over the snapshot that already holds it changes nothing):
//   {"t": "set",  "job": J, "key": K, "value": <bytes>}
//   {"t": "del",  "job": J, "key": K}
//   {"t": "rdzv", "job": J, "generation": G, "state": <Rendezvous::save()> or null}
//   {"t": "drop", "job": J}
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

class StateLog {
 public:
  virtual ~StateLog() = default;
  // Every record written so far, oldest first: the snapshot's, then the journal's.
  virtual Result<std::vector<Json>> load() = 0;
  // Adds one record; it survives the daemon's death once this returns (a machine crash: once
  // sync() has run too).
  virtual Status append(const Json& record) = 0;
  // Makes `records` the whole state (the snapshot) and empties the journal.
  virtual Status rewrite(const std::vector<Json>& records) = 0;
  // Flushes appended records to the disk (called on the daemon's timer).
  virtual Status sync() = 0;
  virtual std::uint64_t journal_bytes() const = 0;
  virtual std::uint64_t snapshot_bytes() const = 0;
  // What load() had to repair (a torn record dropped from the journal's end), or empty.
  virtual std::string load_note() const = 0;
};

// On disk each record is [u32 body length][u32 CRC-32 of the body][MessagePack body], lengths
// little-endian, so a record cut short by a crash is recognised and dropped.
std::string encode_state_record(const Json& record);
struct DecodedRecords {
  std::vector<Json> records;
  std::size_t good_bytes = 0;  // where the last whole record ends
  std::string damage;          // empty, or what was wrong at good_bytes
};
DecodedRecords decode_state_records(std::string_view bytes);

}  // namespace ctrun::rendezvous
