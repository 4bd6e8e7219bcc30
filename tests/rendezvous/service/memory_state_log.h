// A StateLog in memory (--state_dir without files), shared by a Service and its successor.
#pragma once

#include <vector>

#include "rendezvous/core/state_log.h"

namespace ctrun::rendezvous::testing {

class MemoryStateLog final : public StateLog {
 public:
  Result<std::vector<Json>> load() override {
    std::vector<Json> all = snapshot;
    all.insert(all.end(), journal.begin(), journal.end());
    return all;
  }
  Status append(const Json& record) override {
    if (fail_appends) return Error{ErrorCode::kInternal, "disk full"};
    journal.push_back(record);
    journal_size += encode_state_record(record).size();
    return ok_status();
  }
  Status rewrite(const std::vector<Json>& records) override {
    snapshot = records;
    journal.clear();
    journal_size = 0;
    ++rewrites;
    return ok_status();
  }
  Status sync() override { return ok_status(); }
  std::uint64_t journal_bytes() const override { return journal_size; }
  std::uint64_t snapshot_bytes() const override { return 0; }
  std::string load_note() const override { return {}; }

  std::vector<Json> snapshot;
  std::vector<Json> journal;
  std::uint64_t journal_size = 0;
  int rewrites = 0;
  bool fail_appends = false;
};

}  // namespace ctrun::rendezvous::testing
