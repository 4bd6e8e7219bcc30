#include "launcher/diagnosis/hang_report.h"

#include "rendezvous/protocol/dump_keys.h"

#include <catch2/catch.hpp>

namespace ctrun::launcher {
namespace {

// faulthandler's text of a rank waiting in torch's all_reduce (a helper thread listed first, as
// faulthandler lists the newest thread first).
std::string in_all_reduce(int line) {
  return "Thread 0x00007f0000000002 (most recent call first):\n"
         "  File \"/usr/lib/python3.11/threading.py\", line 327 in wait\n"
         "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
         "\n"
         "Current thread 0x00007f0000000001 (most recent call first):\n"
         "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line "
         "1322 in all_reduce\n"
         "  File \"/job/train.py\", line " +
         std::to_string(line) +
         " in train_step\n"
         "  File \"/job/train.py\", line 50 in <module>\n";
}

const char* kInOwnFunction =
    "Current thread 0x00007f0000000001 (most recent call first):\n"
    "  File \"/job/train.py\", line 20 in slow_data\n"
    "  File \"/job/train.py\", line 28 in train_step\n"
    "  File \"/job/train.py\", line 50 in <module>\n";

RankStacks rank(int r, std::int64_t step, std::string python) {
  RankStacks s;
  s.rank = r;
  s.node = r / 4;
  s.host = "gpu0" + std::to_string(r / 4);
  s.step = step;
  s.python_stacks = std::move(python);
  return s;
}

TEST_CASE(
    "hang report: a Python rank's place is the main thread's innermost frame, from the "
    "user's code that called into the library") {
  auto place = python_place(in_all_reduce(31));
  REQUIRE(place);
  CHECK(place->function == "all_reduce");
  CHECK(place->at == "distributed_c10d.py:1322");
  CHECK(place->from == "train.py:31");

  auto own = python_place(kInOwnFunction);
  REQUIRE(own);
  CHECK(own->function == "slow_data");
  CHECK(own->at == "train.py:20");
  CHECK(own->from.empty());

  CHECK_FALSE(python_place("faulthandler: nothing here\n"));
}

TEST_CASE("hang report: a native rank's place skips the waits of libc and the runtime") {
  const std::string stacks =
      "PID 4242 - process\n"
      "TID 4242:\n"
      "#0  0x00007f1d2c8a5d96 __futex_abstimed_wait_common\n"
      "#1  0x00007f1d2c8a8bb0 pthread_cond_wait@@GLIBC_2.3.2\n"
      "#2  0x00007f1d2cb2f1a3 std::condition_variable::wait(std::unique_lock<std::mutex>&)\n"
      "#3  0x00005581a1b2c3d4 gloo::transport::tcp::UnboundBuffer::waitRecv(int*, "
      "std::chrono::duration<long, std::ratio<1l, 1000l> >)\n"
      "#4  0x00005581a1b2c400 gloo::allreduce(gloo::AllreduceOptions&)\n"
      "#5  0x00005581a1b2c500 main\n"
      "TID 4243:\n"
      "#0  0x00007f1d2c8a5d96 epoll_wait\n";
  auto place = native_place(stacks);
  REQUIRE(place);
  CHECK(place->function == "gloo::allreduce(gloo::AllreduceOptions&)");

  const std::string sleeping =
      "TID 7:\n#0  0x1 __GI___clock_nanosleep\n#1  0x2 usleep\n#2  0x3 slow_function()\n";
  CHECK(native_place(sleeping)->function == "slow_function()");
  CHECK_FALSE(native_place("eu-stack: dwfl_linux_proc_attach pid 7: Operation not permitted\n"));
}

TEST_CASE(
    "hang report: the rank stuck in its own function while the others wait in a "
    "collective is named") {
  std::vector<RankStacks> ranks;
  for (int r = 0; r < 8; ++r) {
    ranks.push_back(r == 5 ? rank(r, 117, kInOwnFunction) : rank(r, 118, in_all_reduce(31)));
  }
  const HangReport report = build_hang_report(ranks, {}, {});
  REQUIRE(report.groups.size() == 2);
  CHECK(report.groups[0].ranks == std::vector<int>{0, 1, 2, 3, 4, 6, 7});
  CHECK(report.groups[1].ranks == std::vector<int>{5});
  CHECK(report.suspects == std::vector<int>{5});
  const auto lines = hang_report_lines(report);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] ==
        "ranks 0-4,6-7 at step 118 in all_reduce (distributed_c10d.py:1322, from train.py:31); "
        "rank 5 at step 117 in slow_data (train.py:20)");
  CHECK(lines[1] ==
        "rank 5 stands apart: ranks 0-4,6-7 wait in all_reduce (distributed_c10d.py:1322, from "
        "train.py:31) at step 118");

  const auto json = hang_report_json(report, ranks);
  CHECK(json["suspects"] == rendezvous::Json::array({5}));
  CHECK(json["groups"][1]["function"] == "slow_data");
  CHECK(json["ranks"].size() == 8);
  auto back = rank_stacks_from_json(json["ranks"][5]);
  REQUIRE(back);
  CHECK(back->step == 117);
  CHECK(back->python_stacks == kInOwnFunction);
}

TEST_CASE(
    "hang report: ranks that all stand in one place name no suspect, and a node that sent "
    "nothing is said") {
  std::vector<RankStacks> ranks{rank(0, 9, in_all_reduce(31)), rank(1, 9, in_all_reduce(31))};
  const HangReport report = build_hang_report(ranks, {3, 2}, {});
  CHECK(report.suspects.empty());
  const auto lines = hang_report_lines(report);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] ==
        "ranks 0-1 at step 9 in all_reduce (distributed_c10d.py:1322, from train.py:31)");
  CHECK(lines[1] == "no stacks in time from nodes 2-3");
}

TEST_CASE(
    "hang report: a rank behind the others' step is the suspect before one that only "
    "stands elsewhere") {
  std::vector<RankStacks> ranks{rank(0, 10, in_all_reduce(31)), rank(1, 10, in_all_reduce(31)),
                                rank(2, 10, in_all_reduce(40)), rank(3, 9, kInOwnFunction)};
  const HangReport report = build_hang_report(ranks, {}, {});
  CHECK(report.suspects == std::vector<int>{3});
}

TEST_CASE(
    "hang report: the Flight Recorder's dumps name the ranks that did not enter the last "
    "collective") {
  std::vector<FlightRecord> records;
  for (int r = 0; r < 4; ++r) {
    FlightRecord f;
    f.rank = r;
    f.last.push_back(
        {"0", r == 2 ? 117 : 118, "nccl:all_reduce", r == 2 ? "completed" : "started"});
    records.push_back(f);
  }
  auto lines = flight_record_lines(records);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] ==
        "NCCL flight recorder: process group 0: collective #118 (nccl:all_reduce) entered by "
        "ranks 0-1,3, not by rank 2 (last #117)");

  for (auto& f : records) f.last[0] = {"0", 118, "nccl:all_reduce", "started"};
  lines = flight_record_lines(records);
  CHECK(lines[0] ==
        "NCCL flight recorder: process group 0: collective #118 (nccl:all_reduce) entered by every "
        "rank that dumped, not completed by ranks 0-3");

  auto back = flight_record_from_json(flight_record_json(records[1]));
  REQUIRE(back);
  CHECK(back->rank == 1);
  CHECK(back->last.at(0).op == "nccl:all_reduce");
}

TEST_CASE(
    "hang report: dump answers as they come, node 0's saying how many nodes, bad ones missing") {
  const std::string rank3 =
      R"({"node": 1, "nodes": 3, "host": "b", "ranks": [{"rank": 3, "node": 1, "host": "b", )"
      R"("kind": "python", "stacks": ""}]})";
  // ctrun status --dump: node 0 says the round has 3 nodes; node 2's answer is no object.
  DumpAnswers asked_by_hand(1, /*nodes_from_node0=*/true);
  asked_by_hand.add(0, R"({"node": 0, "nodes": 3, "host": "a", "ranks": []})");
  CHECK(asked_by_hand.nodes() == 3);
  asked_by_hand.add(1, rank3);
  asked_by_hand.add(2, "[1, 2");
  JobStacks job = asked_by_hand.job();
  CHECK(job.missing_nodes == std::vector<int>{2});
  REQUIRE(job.ranks.size() == 1);
  CHECK(job.ranks[0].rank == 3);
  // A count past any round is bounded; an agent, which knows its round, keeps its own.
  DumpAnswers wild(1, true);
  wild.add(0, R"({"nodes": 99999999999})");
  CHECK(wild.nodes() == 1 << 20);
  DumpAnswers agent(2, /*nodes_from_node0=*/false);
  agent.add(0, R"({"nodes": 7})");
  CHECK(agent.nodes() == 2);
  CHECK(agent.job().missing_nodes == std::vector<int>{1});

  // The request's "at" (when it was made: requests made together are joined).
  const std::string request = rendezvous::encode_dump_request({"watchdog", "node 1", 1234});
  CHECK(rendezvous::dump_request_at(request) == 1234);
  CHECK(rendezvous::dump_request_at("not json") == 0);
  CHECK(rendezvous::dump_request_at(R"({"at": "soon"})") == 0);
}

}  // namespace
}  // namespace ctrun::launcher
