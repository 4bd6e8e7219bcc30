// ServiceJournal: --state_dir's records written and read back, and when the whole state is
// rewritten, over a StateLog in memory. The service's replay of them is state_test's.
#include "rendezvous/service/service_journal.h"

#include <string>
#include <vector>

#include "catch.h"
#include "memory_state_log.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;

TEST_CASE("service journal: each record reads back as written", "[unit][service][state]") {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  auto set = decode_job_record(set_record("job", "k", bytes));
  REQUIRE(set.ok());
  CHECK(set.value().kind == JobRecord::Kind::kSet);
  CHECK(set.value().job == "job");
  CHECK(set.value().key == "k");
  CHECK(set.value().value == bytes);
  auto del = decode_job_record(delete_record("job", "k"));
  REQUIRE(del.ok());
  CHECK(del.value().kind == JobRecord::Kind::kDelete);
  CHECK(del.value().key == "k");
  auto rdzv = decode_job_record(rendezvous_record("job", 7, Json{{"round", 3}}));
  REQUIRE(rdzv.ok());
  CHECK(rdzv.value().kind == JobRecord::Kind::kRendezvous);
  CHECK(rdzv.value().generation == 7);
  CHECK(rdzv.value().state == Json{{"round", 3}});
  auto none = decode_job_record(rendezvous_record("job", 1, Json()));
  REQUIRE(none.ok());
  CHECK(none.value().state.is_null());
  auto drop = decode_job_record(drop_record("job"));
  REQUIRE(drop.ok());
  CHECK(drop.value().kind == JobRecord::Kind::kDrop);

  auto unknown = decode_job_record(Json{{"t", "grow"}, {"job", "job"}});
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message == "unknown record type 'grow'");
  CHECK_FALSE(decode_job_record(Json{{"t", "set"}, {"key", "k"}}).ok());   // no job
  CHECK_FALSE(decode_job_record(Json{{"t", "rdzv"}, {"job", "j"}}).ok());  // no generation
}

TEST_CASE("service journal: a failed append has the whole state rewritten at the next tick",
          "[unit][service][state]") {
  MemoryStateLog log;
  std::vector<std::string> lines;
  ServiceJournal journal(&log, 1 << 20, [&lines](const std::string& l) { lines.push_back(l); });
  REQUIRE(journal.on());
  journal.append(set_record("job", "a", "1"));
  CHECK(log.journal.size() == 1);
  int snapshots = 0;
  auto snapshot = [&snapshots] {
    ++snapshots;
    return std::vector<Json>{set_record("job", "a", "1"), set_record("job", "b", "2")};
  };
  journal.tick(snapshot);
  CHECK(snapshots == 0);  // a small journal stays as it is

  log.fail_appends = true;
  journal.append(set_record("job", "b", "2"));
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "state: disk full; the whole state is rewritten at the next tick");
  log.fail_appends = false;
  journal.append(set_record("job", "c", "3"));  // would not add up: not appended
  CHECK(log.journal.size() == 1);
  journal.tick(snapshot);
  CHECK(snapshots == 1);
  CHECK(log.snapshot.size() == 2);
  CHECK(log.journal.empty());
  journal.append(drop_record("job"));  // appended again
  CHECK(log.journal.size() == 1);
}

TEST_CASE("service journal: a journal past compact_bytes becomes a snapshot, no state is nothing",
          "[unit][service][state]") {
  MemoryStateLog log;
  ServiceJournal journal(&log, 64, [](const std::string&) {});
  for (int i = 0; i < 10; ++i) journal.append(set_record("job", "key" + std::to_string(i), "v"));
  int snapshots = 0;
  journal.tick([&snapshots] {
    ++snapshots;
    return std::vector<Json>{};
  });
  CHECK(snapshots == 1);
  CHECK(log.rewrites == 1);

  ServiceJournal off(nullptr, 64, [](const std::string&) {});
  CHECK_FALSE(off.on());
  off.append(set_record("job", "k", "v"));
  off.tick([&snapshots] {
    ++snapshots;
    return std::vector<Json>{};
  });
  CHECK(snapshots == 1);
  auto loaded = off.load();
  REQUIRE(loaded.ok());
  CHECK(loaded.value().empty());
}
