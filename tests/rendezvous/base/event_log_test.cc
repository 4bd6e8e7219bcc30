#include "rendezvous/base/event_log.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "ctrun/rendezvous/clock.h"
#include "rendezvous/core/rendezvous.h"

using namespace ctrun::rendezvous;
using namespace std::chrono_literals;

TEST_CASE("event log: a line is one JSON object with time, source, host, pid and event") {
  const auto at = std::chrono::system_clock::time_point(1'700'000'000'123ms);
  const std::string line =
      format_event(at, "ctrund", "n1", 42, "round", Json{{"round", 3}, {"event", "spoofed"}});
  REQUIRE(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
  const Json e = Json::parse(line);
  CHECK(e.at("time") == "2023-11-14T22:13:20.123Z");
  CHECK(e.at("source") == "ctrund");
  CHECK(e.at("host") == "n1");
  CHECK(e.at("pid") == 42);
  CHECK(e.at("event") == "round");  // a field cannot override the fixed keys
  CHECK(e.at("round") == 3);
}

TEST_CASE("event log: bytes that are not UTF-8 in a field do not lose the line") {
  const std::string line = format_event(std::chrono::system_clock::now(), "ctrun", "h", 1,
                                        "job_end", Json{{"reason", std::string("bad \xff byte")}});
  const Json e = Json::parse(line);
  CHECK(e.at("reason").get<std::string>().find("bad ") == 0);
}

TEST_CASE("event log: lines from two writers on one file stay whole and in order") {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ctrun_events_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove(path);
  {
    auto a = EventLog::open(path, "ctrun");
    auto b = EventLog::open(path, "ctrun rendezvous");
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    for (int i = 0; i < 100; ++i) {
      a.value()->write("tick", Json{{"i", i}});
      b.value()->sink()("tock", Json{{"i", i}});
    }
  }
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const Json e = Json::parse(line);
    CHECK(e.at("i") == n / 2);
    CHECK(e.at("event") == (n % 2 == 0 ? "tick" : "tock"));
  }
  CHECK(n == 200);
  std::filesystem::remove(path);
}

TEST_CASE("event log: a path that cannot be opened is a clear error") {
  auto r = EventLog::open("/nonexistent-dir/events.jsonl", "ctrund");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message ==
        "cannot open event log '/nonexistent-dir/events.jsonl': No such file or directory");
}

TEST_CASE("event log: a rendezvous tells join, round, node lost and job end with its job id") {
  ManualClock clock;
  RendezvousConfig config;
  config.min_nodes = 2;
  config.max_nodes = 2;
  Rendezvous r("job7", config, clock);
  std::vector<Json> events;
  r.set_event_sink([&](const std::string& name, Json fields) {
    fields["event"] = name;
    events.push_back(std::move(fields));
  });
  REQUIRE(r.join(NodeInfo{"a", "10.0.0.1", 4, 29500, -1}).ok());
  REQUIRE(r.join(NodeInfo{"b", "10.0.0.2", 2, 29501, -1}).ok());
  (void)r.remove_node("b", "keep-alive timeout");
  (void)r.close("closed by the user");
  std::vector<std::string> names;
  for (const auto& e : events) {
    CHECK(e.at("job") == "job7");
    names.push_back(e.at("event"));
  }
  CHECK(names ==
        std::vector<std::string>{"join", "join", "round", "node_lost", "round_open", "job_end"});
  const Json& round = events[2];
  CHECK(round.at("round") == 0);
  CHECK(round.at("world_size") == 6);
  CHECK(round.at("master_addr") == "10.0.0.1");
  REQUIRE(round.at("members").size() == 2);
  CHECK(round.at("members")[1].at("node") == "b");
  CHECK(round.at("members")[1].at("group_rank") == 1);
  CHECK(events[3].at("reason") == "keep-alive timeout");
  CHECK(events[5].at("state") == "closed");
}
