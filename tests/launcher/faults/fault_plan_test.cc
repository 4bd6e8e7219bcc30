#include "launcher/faults/fault_plan.h"

#include <csignal>
#include <set>

#include "catch.h"

using namespace ctrun::launcher;
using Json = ctrun::rendezvous::Json;

namespace {
FaultPlan ok(const ctrun::rendezvous::Result<FaultPlan>& r) {
  INFO((r ? "" : r.error().message));
  REQUIRE(r);
  return r.value();
}
std::string error(const ctrun::rendezvous::Result<FaultPlan>& r) {
  REQUIRE_FALSE(r);
  return r.error().message;
}
}  // namespace

TEST_CASE("fault plan: JSON, inline and printed forms say the same") {
  const auto json = ok(parse_fault_plan_json(
      R"({"seed": 7, "faults": [{"kind": "kill", "rank": 3, "after": 20},
          {"kind": "hang", "rank": 1, "after": 5.5, "duration": 15},
          {"kind": "straggler", "node": 1, "local_rank": 0, "after": 2, "duration": 30,
           "speed": 0.25},
          {"kind": "segv", "rank": 0, "window": [10, 40]}]})",
      "plan.json"));
  REQUIRE(json.faults.size() == 4);
  CHECK(json.faults[0].signo == SIGKILL);
  CHECK(json.faults[1].kind == FaultKind::kHang);
  CHECK(json.faults[2].speed == 0.25);
  CHECK(*json.faults[2].node == 1);
  // A window is drawn from the seed: the same on every agent, inside the window.
  const double drawn = json.faults[3].after;
  CHECK(drawn >= 10);
  CHECK(drawn <= 40);
  CHECK(ok(parse_fault_plan_json(
               R"({"seed": 7, "faults": [{"kind": "kill", "rank": 3, "after": 20},
                   {"kind": "hang", "rank": 1, "after": 5.5, "duration": 15},
                   {"kind": "straggler", "node": 1, "local_rank": 0, "after": 2, "duration": 30,
                    "speed": 0.25},
                   {"kind": "segv", "rank": 0, "window": [10, 40]}]})",
               "again"))
            .faults[3]
            .after == drawn);
  // The printed plan reads back to the very same faults.
  const auto printed = fault_plan_json(json);
  const auto back = ok(parse_fault_plan_json(printed.dump(), "printed"));
  CHECK(fault_plan_json(back) == printed);
  CHECK(back.faults[3].after == drawn);

  const auto inline_plan =
      ok(parse_inline_fault_plan("kill:rank=3,after=20;hang:rank=1,after=5.5,duration=15"));
  REQUIRE(inline_plan.faults.size() == 2);
  CHECK(fault_plan_json(inline_plan)["faults"] ==
        fault_plan_json(ok(parse_fault_plan_json(
            R"({"faults": [{"kind": "kill", "rank": 3, "after": 20},
                {"kind": "hang", "rank": 1, "after": 5.5, "duration": 15}]})",
            "p")))["faults"]);
  CHECK(describe_fault(json.faults[1]) ==
        "fault 2: rank 1 hung (SIGSTOP, resumed after 15.000 s) at 5.500 s");
  CHECK(describe_fault(json.faults[2]) ==
        "fault 3: node 1 local rank 0 slowed to 25 % for 30.000 s at 2.000 s");
}

TEST_CASE("fault plan: a fault at a training step") {
  const auto plan = ok(parse_inline_fault_plan("kill:rank=2,at_step=200"));
  REQUIRE(plan.faults.size() == 1);
  CHECK(*plan.faults[0].at_step == 200);
  CHECK(fault_plan_json(plan).dump() ==
        R"({"faults":[{"at_step":200,"kind":"kill","rank":2}],"seed":0})");
  CHECK(fault_plan_json(ok(parse_fault_plan_json(fault_plan_json(plan).dump(), "p"))) ==
        fault_plan_json(plan));
  CHECK(error(parse_inline_fault_plan("kill:rank=2,at_step=0")) ==
        "--faults: fault 1: at_step: expected a step number (1 or more), got 0");
  CHECK(error(parse_inline_fault_plan("kill:rank=2,at_step=5,after=3")) ==
        "--faults: fault 1: give a time (after, window) or a step (at_step), not both");
  const auto random = ok(random_fault_plan("random:seed=3,count=4,ranks=0-3,steps=100-200"));
  for (const Fault& f : random.faults) {
    REQUIRE(f.at_step);
    CHECK(*f.at_step >= 100);
    CHECK(*f.at_step <= 200);
  }
  CHECK(error(random_fault_plan("random:seed=3,ranks=0-3,steps=1-2,window=1-2")) ==
        "--faults=random: give window=FROM-TO (the seconds faults fall in) or steps=FIRST-LAST "
        "(the steps), one of them");
}

TEST_CASE("fault plan: a bad plan is one line naming the fault and what was wrong") {
  CHECK(error(parse_inline_fault_plan("explode:rank=1,after=2")) ==
        "--faults: fault 1: unknown kind 'explode' (kill, term, int, segv, abrt, hang, straggler, "
        "node_lost, exception, cuda_error, store_latency, cut_off, link_lost, disk_full, "
        "rendezvous_restart)");
  CHECK(error(parse_inline_fault_plan("kill:rank=1")) ==
        "--faults: fault 1: says not when: give after=SECONDS, window=FROM-TO or at_step=N");
  CHECK(error(parse_inline_fault_plan("kill:after=1")) ==
        "--faults: fault 1: says not where: give rank=N, or node=N and local_rank=N");
  CHECK(error(parse_inline_fault_plan("kill:rank=1,after=1;straggler:rank=0,after=1")) ==
        "--faults: fault 2: straggler needs duration=SECONDS");
  CHECK(error(parse_inline_fault_plan("straggler:rank=0,after=1,duration=2,speed=1")) ==
        "--faults: fault 1: speed: expected a share of time between 0 and 1, got 1.0");
  CHECK(error(parse_inline_fault_plan("kill:rank=x,after=1")) ==
        "--faults: fault 1: rank: expected a rank or node number, got \"x\"");
  CHECK(error(parse_inline_fault_plan("kill:rank=1,after=-1")) ==
        "--faults: fault 1: after: expected a non-negative number, got -1.0");
  CHECK(error(parse_inline_fault_plan("kill:rank=1,node=0,local_rank=1,after=1")) ==
        "--faults: fault 1: give rank, or node and local_rank, not both");
  CHECK(error(parse_inline_fault_plan("kill:rank=1,after=1,duration=3")) ==
        "--faults: fault 1: kill has no duration");
  CHECK(error(parse_inline_fault_plan("kill:rank=1,window=5-2")) ==
        "--faults: fault 1: window: expected FROM-TO seconds, got '5-2'");
  CHECK(error(parse_fault_plan_json("[1]", "p.json")) ==
        "--faults: p.json: not a JSON object {\"faults\": [...]}");
  CHECK(error(parse_fault_plan_json(R"({"faults": [{"rank": 1}]})", "p.json")) ==
        "--faults: fault 1: expected an object with a \"kind\"");
  CHECK(error(parse_fault_plan_json(R"({"faults": [], "extra": 1})", "p.json")) ==
        "--faults: p.json: unknown field 'extra' (seed, faults)");
}

TEST_CASE("fault plan: random plans come from the seed, the same seed giving the same plan") {
  const std::string spec =
      "random:seed=42,count=8,kinds=kill+hang+straggler,ranks=0-7,window=10-60";
  const auto a = ok(random_fault_plan(spec));
  const auto b = ok(random_fault_plan(spec));
  REQUIRE(a.faults.size() == 8);
  CHECK(fault_plan_json(a) == fault_plan_json(b));
  CHECK(fault_plan_json(a) != fault_plan_json(ok(random_fault_plan(
                                  "random:seed=43,count=8,kinds=kill+hang+straggler,ranks=0-7,"
                                  "window=10-60"))));
  std::set<FaultKind> kinds;
  for (const Fault& f : a.faults) {
    CHECK(*f.rank >= 0);
    CHECK(*f.rank <= 7);
    CHECK(f.after >= 10);
    CHECK(f.after <= 60);
    kinds.insert(f.kind);
    if (f.kind != FaultKind::kSignal) CHECK(f.duration == 10);
  }
  CHECK(kinds.size() > 1);
  // Printed, it replays as a plain plan.
  CHECK(fault_plan_json(ok(parse_fault_plan_json(fault_plan_json(a).dump(), "p"))) ==
        fault_plan_json(a));
  CHECK(error(random_fault_plan("random:count=2,ranks=0-1,window=1-2")) ==
        "--faults=random: give seed=N: the seed makes the plan");
  CHECK(error(random_fault_plan("random:seed=1,window=1-2")) ==
        "--faults=random: give ranks=FIRST-LAST: the ranks faults may hit");
  CHECK(error(random_fault_plan("random:seed=1,ranks=0-3,window=1-2,kinds=kill+boom")) ==
        "--faults=random: kinds: expected kinds joined by + (kill, term, int, segv, abrt, hang, "
        "straggler, node_lost, exception, cuda_error, cut_off), got 'kill+boom'");
  CHECK(error(random_fault_plan("random:seed=1,ranks=3-1,window=1-2")) ==
        "--faults=random: ranks: expected FIRST-LAST ranks, got '3-1'");
}

TEST_CASE("fault plan: a lost node is a node, or the node of a rank") {
  const auto plan =
      ok(parse_inline_fault_plan("node_lost:node=1,after=3;node_lost:rank=5,at_step=9"));
  CHECK(plan.faults[0].kind == FaultKind::kNodeLost);
  CHECK(describe_fault(plan.faults[0]) ==
        "fault 1: node 1 lost (its agent and workers killed) at 3.000 s");
  CHECK(describe_fault(plan.faults[1]) ==
        "fault 2: the node of rank 5 lost (its agent and workers killed) at step 9");
  CHECK(fault_plan_json(plan)["faults"][0] ==
        Json{{"kind", "node_lost"}, {"node", 1}, {"after", 3.0}});
  CHECK(error(parse_inline_fault_plan("node_lost:node=1,local_rank=0,after=1")) ==
        "--faults: fault 1: the fault is a whole node's: give node=N (or the node of a rank=N)");
  CHECK(error(parse_inline_fault_plan("node_lost:node=1,after=1,duration=2")) ==
        "--faults: fault 1: node_lost has no duration");
}

TEST_CASE("fault plan: an exception is raised in a worker, at a step or a time") {
  const auto plan = ok(
      parse_inline_fault_plan("exception:rank=2,at_step=30;exception:node=0,local_rank=1,after=4"));
  CHECK(plan.faults[0].kind == FaultKind::kException);
  CHECK(describe_fault(plan.faults[0]) == "fault 1: an exception raised in rank 2 at step 30");
  CHECK(describe_fault(plan.faults[1]) ==
        "fault 2: an exception raised in node 0 local rank 1 at 4.000 s");
  CHECK(fault_plan_json(plan)["faults"][0] ==
        Json{{"kind", "exception"}, {"rank", 2}, {"at_step", 30}});
  CHECK(error(parse_inline_fault_plan("exception:rank=1,after=1,duration=2")) ==
        "--faults: fault 1: exception has no duration");
  const auto drawn =
      ok(random_fault_plan("random:seed=9,count=6,kinds=exception,ranks=0-1,steps=5-9"));
  for (const Fault& f : drawn.faults) CHECK(f.kind == FaultKind::kException);
}

TEST_CASE("fault plan: a CUDA error in a worker, at a step or a time, drawn only when asked for") {
  const auto plan =
      ok(parse_inline_fault_plan("cuda_error:rank=1,at_step=12;cuda_error:node=1,local_rank=0,"
                                 "window=2-4"));
  CHECK(plan.faults[0].kind == FaultKind::kCudaError);
  CHECK(describe_fault(plan.faults[0]) == "fault 1: a CUDA error in rank 1 at step 12");
  CHECK(fault_plan_json(plan)["faults"][0] ==
        Json{{"kind", "cuda_error"}, {"rank", 1}, {"at_step", 12}});
  CHECK(plan.faults[1].after >= 2.0);
  CHECK(plan.faults[1].after <= 4.0);
  // The JSON form reads back the same.
  const auto json = ok(parse_fault_plan_json(fault_plan_json(plan).dump(), "plan.json"));
  CHECK(fault_plan_json(json) == fault_plan_json(plan));
  CHECK(error(parse_inline_fault_plan("cuda_error:rank=1,after=1,duration=2")) ==
        "--faults: fault 1: cuda_error has no duration");
  // Random plans draw it only where kinds= names it: it needs a GPU.
  const auto drawn =
      ok(random_fault_plan("random:seed=4,count=5,kinds=cuda_error,ranks=0-3,steps=5-50"));
  REQUIRE(drawn.faults.size() == 5);
  for (const Fault& f : drawn.faults) CHECK(f.kind == FaultKind::kCudaError);
  const auto plain = ok(random_fault_plan("random:seed=4,count=20,ranks=0-3,window=1-9"));
  for (const Fault& f : plain.faults) CHECK(f.kind != FaultKind::kCudaError);
}

TEST_CASE("fault plan: ctrun fault's one fault, at once unless it says when") {
  auto now = parse_fault_request("kill:rank=1");
  REQUIRE(now);
  CHECK(now.value() == Json{{"kind", "kill"}, {"rank", 1}, {"after", 0.0}});
  auto later = parse_fault_request("hang:rank=0,duration=5,after=2");
  REQUIRE(later);
  CHECK(later.value() == Json{{"kind", "hang"}, {"rank", 0}, {"after", 2.0}, {"duration", 5.0}});
  auto at_step = parse_fault_request("exception:node=1,local_rank=0,at_step=40");
  REQUIRE(at_step);
  CHECK(at_step.value()["at_step"] == 40);
  CHECK_FALSE(at_step.value().contains("after"));
  CHECK(parse_fault_request("kill:rank=1;term:rank=2").error().message ==
        "ctrun fault: one fault at a time, got 'kill:rank=1;term:rank=2'");
  CHECK(parse_fault_request("boom:rank=1").error().message ==
        "ctrun fault: unknown kind 'boom' (kill, term, int, segv, abrt, hang, straggler, "
        "node_lost, exception, cuda_error, store_latency, cut_off, link_lost, disk_full, "
        "rendezvous_restart)");
  CHECK(parse_fault_request("kill").error().message ==
        "ctrun fault: says not where: give rank=N, or node=N and local_rank=N");
}

TEST_CASE("fault plan: store latency is the daemon's, for a time") {
  const auto plan = ok(parse_inline_fault_plan("store_latency:ms=250,duration=3,after=2"));
  const Fault& f = plan.faults[0];
  CHECK(f.kind == FaultKind::kStoreLatency);
  CHECK(f.ms == 250);
  CHECK(describe_fault(f) ==
        "fault 1: the rendezvous answering 250 ms late for 3.000 s at 2.000 s");
  CHECK(fault_plan_json(plan)["faults"][0] ==
        Json{{"kind", "store_latency"}, {"after", 2.0}, {"duration", 3.0}, {"ms", 250.0}});
  CHECK(error(parse_inline_fault_plan("store_latency:rank=1,ms=5,duration=1,after=1")) ==
        "--faults: fault 1: store latency is the rendezvous daemon's: no rank or node");
  CHECK(error(parse_inline_fault_plan("store_latency:duration=1,after=1")) ==
        "--faults: fault 1: store latency needs ms=MILLISECONDS");
  CHECK(error(parse_inline_fault_plan("store_latency:ms=5,after=1")) ==
        "--faults: fault 1: store latency needs duration=SECONDS");
  CHECK(error(parse_inline_fault_plan("store_latency:ms=5,duration=1,at_step=3")) ==
        "--faults: fault 1: store latency is timed: give after=SECONDS or window");
  CHECK(error(parse_inline_fault_plan("kill:rank=1,after=1,ms=3")) ==
        "--faults: fault 1: ms is store latency's");
  CHECK(error(random_fault_plan("random:seed=1,ranks=0-1,window=1-2,kinds=store_latency")) ==
        "--faults=random: kinds: expected kinds joined by + (kill, term, int, segv, abrt, hang, "
        "straggler, node_lost, exception, cuda_error, cut_off), got 'store_latency'");
}

TEST_CASE("fault plan: the node's faults: cut off, a lost link, a full disk") {
  const auto plan = ok(parse_inline_fault_plan(
      "cut_off:node=1,after=2,duration=5;link_lost:node=0,peer=1,at_step=30,duration=4;"
      "disk_full:rank=3,path=/ckpt/run 1,after=1,duration=10"));
  REQUIRE(plan.faults.size() == 3);
  CHECK(plan.faults[0].kind == FaultKind::kCutOff);
  CHECK(describe_fault(plan.faults[0]) ==
        "fault 1: node 1 cut off from the rendezvous for 5.000 s at 2.000 s");
  CHECK(plan.faults[1].kind == FaultKind::kLinkLost);
  CHECK(plan.faults[1].peer == 1);
  CHECK(describe_fault(plan.faults[1]) ==
        "fault 2: the link between node 0 and node 1 lost for 4.000 s at step 30");
  CHECK(plan.faults[2].path == "/ckpt/run 1");
  CHECK(describe_fault(plan.faults[2]) ==
        "fault 3: the disk of '/ckpt/run 1' on the node of rank 3 full for 10.000 s at 1.000 s");
  // The JSON form reads back as the same plan.
  const Json json = fault_plan_json(plan);
  CHECK(json["faults"][1] ==
        Json{{"kind", "link_lost"}, {"node", 0}, {"peer", 1}, {"at_step", 30}, {"duration", 4.0}});
  CHECK(fault_plan_json(ok(parse_fault_plan_json(json.dump(), "replay"))) == json);

  CHECK(error(parse_inline_fault_plan("cut_off:node=1,after=2")) ==
        "--faults: fault 1: cut_off needs duration=SECONDS");
  CHECK(error(parse_inline_fault_plan("cut_off:node=1,local_rank=0,after=2,duration=1")) ==
        "--faults: fault 1: the fault is a whole node's: give node=N (or the node of a rank=N)");
  CHECK(error(parse_inline_fault_plan("link_lost:node=1,after=2,duration=1")) ==
        "--faults: fault 1: a lost link is between node=N and peer=M (group ranks)");
  CHECK(error(parse_inline_fault_plan("link_lost:node=1,peer=1,after=2,duration=1")) ==
        "--faults: fault 1: a link's two ends are two nodes: node = peer");
  CHECK(error(parse_inline_fault_plan("disk_full:node=0,after=2,duration=1")) ==
        "--faults: fault 1: disk_full needs path=DIRECTORY (the checkpoint directory)");
  CHECK(error(parse_inline_fault_plan("kill:rank=0,after=2,path=/x")) ==
        "--faults: fault 1: path is disk_full's");
  CHECK(error(parse_inline_fault_plan("kill:rank=0,after=2,peer=1")) ==
        "--faults: fault 1: peer is a lost link's");
  // A random plan may cut a rank's node off.
  const auto random =
      ok(random_fault_plan("random:seed=4,count=3,kinds=cut_off,ranks=0-3,"
                           "window=1-9,duration=2"));
  for (const Fault& f : random.faults) {
    CHECK(f.kind == FaultKind::kCutOff);
    CHECK(f.duration == 2);
  }
}

TEST_CASE("fault plan: a rendezvous restart is timed and has no target") {
  const auto plan = ok(parse_inline_fault_plan("rendezvous_restart:after=3,duration=2"));
  CHECK(plan.faults[0].kind == FaultKind::kRendezvousRestart);
  CHECK(describe_fault(plan.faults[0]) ==
        "fault 1: the rendezvous killed, restarted after 2.000 s at 3.000 s");
  CHECK(ok(parse_inline_fault_plan("rendezvous_restart:after=3")).faults[0].duration == 0);
  CHECK(error(parse_inline_fault_plan("rendezvous_restart:node=0,after=3")) ==
        "--faults: fault 1: the rendezvous is ctrun's, not a node's: no rank or node");
  CHECK(error(parse_inline_fault_plan("rendezvous_restart:at_step=3")) ==
        "--faults: fault 1: a rendezvous restart is timed: give after=SECONDS or window");
}
