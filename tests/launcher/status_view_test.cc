#include "status_view.h"

#include "catch.h"

using namespace ctrun::launcher;
using Json = ctrun::rendezvous::Json;

TEST_CASE("status view: faults injected on purpose are counted and the last one named") {
  const Json answer{{"job", "j"},       {"restarts", 2}, {"faults_injected", 3},
                    {"connections", 1}, {"keys", 4},     {"rendezvous", nullptr}};
  const Json last{{"what", "fault 3: SIGKILL to rank 1 at step 40"},
                  {"time", "2026-11-26T22:00:00.000Z"},
                  {"node", "n1"},
                  {"injected", true}};
  const JobStatus job{answer, 5, last};
  const Json j = job_status_json(job);
  CHECK(j["faults_injected"] == 3);
  CHECK(j["last_fault"] == last);
  CHECK(j["restarts_left"] == 3);
  CHECK(job_status_table(job) ==
        "job j: store, restarts 2 of 5 (3 left)\n"
        "faults injected on purpose: 3; last: fault 3: SIGKILL to rank 1 at step 40 "
        "(2026-11-26T22:00:00.000Z, node n1)\n");
  // None: no line, and null in JSON.
  const JobStatus clean{Json{{"job", "j"}, {"restarts", 0}, {"rendezvous", nullptr}}, -1, Json()};
  CHECK(job_status_json(clean)["faults_injected"] == 0);
  CHECK(job_status_json(clean)["last_fault"].is_null());
  CHECK(job_status_table(clean) == "job j: store, restarts 0\n");
}
