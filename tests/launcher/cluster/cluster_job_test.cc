#include "launcher/cluster/cluster_job.h"

#include <csignal>

#include "catch.h"

using namespace ctrun::launcher;

namespace {
SessionEnd exited(int code, std::string ssh_error = "", std::string job_failure = "") {
  SessionEnd e;
  e.exit_code = code;
  e.ssh_error = std::move(ssh_error);
  e.job_failure = std::move(job_failure);
  return e;
}
}  // namespace

TEST_CASE("cluster_job: every host's agent ends with 0: the launcher exits 0") {
  ClusterJob job({"a", "b"}, 2);
  CHECK_FALSE(job.session_ended(0, exited(0)).exit_code);
  auto last = job.session_ended(1, exited(0));
  REQUIRE(last.exit_code);
  CHECK(*last.exit_code == 0);
  CHECK(last.lines.back() == "the job finished on 2 of 2 hosts");
}

TEST_CASE("cluster_job: a failed job names the host and the rank, and the exit is non-zero") {
  ClusterJob job({"a", "b", "c"}, 3);
  auto first = job.session_ended(1, exited(1, "", "rank 3 on b: ValueError: boom"));
  CHECK(first.lines == std::vector<std::string>{
                           "host b: its agent exited with code 1 (rank 3 on b: ValueError: boom)"});
  CHECK(first.close_input.empty());  // the others learn the job's end from the rendezvous
  // The other nodes hear it from the rendezvous, with the failed node's id in front.
  auto other =
      job.session_ended(0, exited(1, "", "node 'b:77:ab' failed: rank 3 on b: ValueError: boom"));
  CHECK(other.lines == std::vector<std::string>{
                           "host a: its agent exited with code 1 (rank 3 on b: ValueError: boom)"});
  auto last = job.session_ended(2, exited(1));
  REQUIRE(last.exit_code);
  CHECK(*last.exit_code == 1);
  CHECK(last.lines.back() == "the job failed: rank 3 on b: ValueError: boom (hosts b, a, c)");
}

TEST_CASE("cluster_job: an unreachable host below the minimum stops the others, with ssh's line") {
  ClusterJob job({"a", "b"}, 2);
  auto a = job.session_ended(1, exited(255, "ssh: connect to host b port 22: Connection refused"));
  CHECK(a.lines.front() == "host b: ssh: connect to host b port 22: Connection refused");
  CHECK(a.close_input == std::vector<int>{0});
  CHECK(a.arm_stop_grace);
  auto grace = job.stop_grace_over();
  CHECK(grace.kill == std::vector<int>{0});
  auto last = job.session_ended(0, exited(255));  // stopped: not a failure of its own
  REQUIRE(last.exit_code);
  CHECK(*last.exit_code == 255);
  CHECK(last.lines.back() ==
        "the job failed: b: ssh: connect to host b port 22: Connection refused");
}

TEST_CASE("cluster_job: an elastic job loses a host and finishes on the others") {
  ClusterJob job({"a", "b", "c"}, 2);
  auto lost = job.session_ended(2, exited(255, "Timeout, server c not responding."));
  CHECK(lost.close_input.empty());
  CHECK(lost.lines.back() ==
        "host c is lost to the job; 2 hosts run on (the job re-forms without it)");
  job.session_ended(0, exited(0));
  auto last = job.session_ended(1, exited(0));
  REQUIRE(last.exit_code);
  CHECK(*last.exit_code == 0);
  CHECK(last.lines.back() ==
        "the job finished on 2 of 3 hosts; lost on the way: c: Timeout, server c not responding.");
}

TEST_CASE("cluster_job: a signal stops every host, and a second one ends the sessions") {
  ClusterJob job({"a", "b"}, 1);
  auto stop = job.signal(SIGINT);
  CHECK(stop.close_input == std::vector<int>{0, 1});
  CHECK(stop.lines == std::vector<std::string>{"SIGINT: stopping the job on 2 hosts"});
  job.session_ended(0, exited(255));
  auto again = job.signal(SIGINT);
  CHECK(again.kill == std::vector<int>{1});
  auto last = job.session_ended(1, SessionEnd{0, SIGTERM, "", ""});
  REQUIRE(last.exit_code);
  CHECK(last.exit_signal == SIGINT);
  CHECK(job.running() == 0);
}

TEST_CASE("cluster job: ssh's own last line names a lost connection, never the agent's log") {
  CHECK(ssh_error_line({"ssh: connect to host b port 22: Connection refused"}) ==
        "ssh: connect to host b port 22: Connection refused");
  CHECK(ssh_error_line({"Timeout, server c not responding.",
                        "2026-11-27T23:51:39.744Z ctrun: round 0: group rank 2 of 3"}) ==
        "Timeout, server c not responding.");
  CHECK(ssh_error_line({"2026-11-27T23:51:39.744Z ctrun: round 0: group rank 2 of 3"}).empty());
  ClusterJob job({"a", "b", "c"}, 2);
  auto lost = job.session_ended(2, exited(255));
  REQUIRE(lost.lines.size() == 2);
  CHECK(lost.lines[0] ==
        "host c: ssh ended with code 255 and said nothing: the connection to the host was lost");
}
