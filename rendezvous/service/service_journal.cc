#include "rendezvous/service/service_journal.h"

#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous {

Json set_record(const std::string& job, const std::string& key, const std::string& value) {
  return Json{{"t", "set"}, {"job", job}, {"key", key}, {"value", to_binary(value)}};
}

Json delete_record(const std::string& job, const std::string& key) {
  return Json{{"t", "del"}, {"job", job}, {"key", key}};
}

Json rendezvous_record(const std::string& job, int generation, Json state) {
  return Json{{"t", "rdzv"}, {"job", job}, {"generation", generation}, {"state", std::move(state)}};
}

Json drop_record(const std::string& job) { return Json{{"t", "drop"}, {"job", job}}; }

Result<JobRecord> decode_job_record(const Json& r) {
  auto type = get_string(r, "t");
  if (!type) return type.error();
  auto name = get_string(r, "job");
  if (!name) return name.error();
  JobRecord out;
  out.job = std::move(name).value();
  if (type.value() == "drop") {
    out.kind = JobRecord::Kind::kDrop;
    return out;
  }
  if (type.value() == "set" || type.value() == "del") {
    auto key = get_string(r, "key");
    if (!key) return key.error();
    out.key = std::move(key).value();
    if (type.value() == "del") {
      out.kind = JobRecord::Kind::kDelete;
      return out;
    }
    auto value = get_bytes(r, "value");
    if (!value) return value.error();
    out.kind = JobRecord::Kind::kSet;
    out.value = std::move(value).value();
    return out;
  }
  if (type.value() == "rdzv") {
    auto generation = get_int(r, "generation");
    if (!generation) return generation.error();
    out.kind = JobRecord::Kind::kRendezvous;
    out.generation = static_cast<int>(generation.value());
    if (auto state = r.find("state"); state != r.end()) out.state = *state;
    return out;
  }
  return Error{ErrorCode::kBadRequest, "unknown record type '" + type.value() + "'"};
}

void ServiceJournal::append(const Json& record) {
  if (!state_ || broken_) return;
  if (auto s = state_->append(record); !s) {
    // Later records would not add up without this one: rewrite the whole state instead.
    log_("state: " + s.error().message + "; the whole state is rewritten at the next tick");
    broken_ = true;
  }
}

void ServiceJournal::tick(const std::function<std::vector<Json>()>& snapshot) {
  if (!state_) return;
  if (broken_ || (state_->journal_bytes() > compact_bytes_ &&
                  state_->journal_bytes() > state_->snapshot_bytes())) {
    rewrite(snapshot());
  }
  if (auto s = state_->sync(); !s) log_("state: " + s.error().message);
}

bool ServiceJournal::rewrite(const std::vector<Json>& records) {
  if (!state_) return true;
  if (auto s = state_->rewrite(records); !s) {
    log_("state: cannot write a snapshot: " + s.error().message);
    broken_ = true;
    return false;
  }
  broken_ = false;
  return true;
}

Result<std::vector<Json>> ServiceJournal::load() {
  if (!state_) return std::vector<Json>{};
  return state_->load();
}

}  // namespace ctrun::rendezvous
