// ConnectionLimits: who ctrund admits, and how often it says it refused, in memory.
#include "rendezvous/service/connection_limits.h"

#include <string>
#include <vector>

#include "catch.h"

using namespace ctrun::rendezvous;
using namespace std::chrono_literals;

namespace {

struct Limits {
  ServiceOptions options;
  ManualClock clock;
  std::vector<std::string> lines;
  ConnectionLimits limits{options, clock, [this](const std::string& l) { lines.push_back(l); }};
};

}  // namespace

TEST_CASE("connection limits: ctrun's protocol, in all and per host", "[unit][service]") {
  Limits l;
  l.options.max_connections = 3;
  l.options.max_connections_per_host = 2;
  CHECK_FALSE(l.limits.admit_ctrund("10.0.0.1:1000").has_value());
  CHECK_FALSE(l.limits.admit_ctrund("10.0.0.1:1001").has_value());
  auto third = l.limits.admit_ctrund("10.0.0.1:1002");
  REQUIRE(third);
  CHECK(*third == "too many connections from this host");
  CHECK_FALSE(l.limits.admit_ctrund("[::1]:5").has_value());
  CHECK(l.limits.ctrund_connections() == 3);
  auto full = l.limits.admit_ctrund("10.0.0.2:7");
  REQUIRE(full);
  CHECK(*full == "daemon is at its connection limit");
  l.limits.ctrund_closed("10.0.0.1:1000");
  CHECK_FALSE(
      l.limits.admit_ctrund("10.0.0.1:1002").has_value());  // room again, from that host too
  REQUIRE(l.lines.size() == 1);  // two refusals within a second: the second counted, not said
  CHECK(l.lines[0] ==
        "10.0.0.1:1002 refused: 2 connections already open from 10.0.0.1 (the limit: ctrund "
        "--max_connections_per_host, an agent's --rdzv_conf max_connections_per_host)");
}

TEST_CASE("connection limits: refusals are said once a second with the count left unsaid",
          "[unit][service]") {
  Limits l;
  l.limits.refused("a refused");
  l.limits.refused("b refused");
  l.limits.refused("c refused");
  CHECK(l.lines == std::vector<std::string>{"a refused"});
  l.clock.advance(1100ms);
  l.limits.refused("d refused");
  REQUIRE(l.lines.size() == 2);
  CHECK(l.lines[1] == "d refused (and 2 more refused since the last said)");
}

TEST_CASE("connection limits: a job's worker store follows its ranks, or a fixed number",
          "[unit][service]") {
  Limits l;
  l.options.worker_store_limits.per_rank = 4;
  l.options.worker_store_limits.margin = 10;
  l.options.worker_store_limits.minimum = 20;
  CHECK(l.limits.worker_store_limit([] { return 0; }) == 20);
  CHECK(l.limits.worker_store_limit([] { return 8; }) == 42);
  CHECK(l.limits.admit_tcpstore(
      "job", 41, [] { return 8; }, "127.0.0.1:9"));
  CHECK_FALSE(l.limits.admit_tcpstore(
      "job", 42, [] { return 8; }, "127.0.0.1:9"));
  REQUIRE(l.lines.size() == 1);
  CHECK(l.lines[0].find("127.0.0.1:9 refused: job 'job' has 42 TCPStore connections open, its "
                        "worker store's limit (4 a rank for its 8 ranks and 10 more, at least "
                        "20)") == 0);
  l.options.worker_store_limits.max_connections = 5;
  bool asked = false;
  CHECK(l.limits.worker_store_limit([&asked] {
    asked = true;
    return 8;
  }) == 5);
  CHECK_FALSE(asked);  // a fixed limit does not count the job's ranks
}
