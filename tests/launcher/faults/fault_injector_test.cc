#include "launcher/faults/fault_injector.h"

#include <csignal>

#include "catch.h"

using namespace ctrun::launcher;
using namespace std::chrono_literals;
using Kind = FaultInjector::Action::Kind;

namespace {
FaultPlan plan(const std::string& text) { return parse_inline_fault_plan(text).value(); }
const FaultInjector::Clock::time_point t0{};
}  // namespace

TEST_CASE("fault injector: a fault fires once, on the node that runs its rank, when due") {
  // Node 1 runs ranks 4..7.
  FaultInjector node1(
      plan("kill:rank=5,after=2;term:rank=2,after=1;abrt:node=1,local_rank=3,after=3"));
  node1.workers_started(1, 4, 4, t0);
  CHECK(node1.poll(t0 + 500ms).actions.empty());
  auto due = node1.poll(t0 + 1s);  // rank 2 is another node's
  CHECK(due.actions.empty());
  CHECK(due.fired.empty());
  due = node1.poll(t0 + 2s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kSignal);
  CHECK(due.actions[0].local_rank == 1);
  CHECK(due.actions[0].signo == SIGKILL);
  REQUIRE(due.fired.size() == 1);
  CHECK(due.fired[0].rank == 5);
  CHECK(due.fired[0].line == "fault 1: SIGKILL to rank 5 at 2.000 s");
  CHECK(node1.poll(t0 + 2500ms).actions.empty());  // once
  due = node1.poll(t0 + 3s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].local_rank == 3);
  CHECK(due.actions[0].signo == SIGABRT);
  CHECK_FALSE(node1.pending());
}

TEST_CASE("fault injector: a fault due while no worker runs waits for the next ones") {
  FaultInjector injector(plan("kill:rank=0,after=1"));
  injector.workers_started(0, 0, 2, t0);
  injector.workers_stopped();  // a restart in progress
  CHECK(injector.poll(t0 + 2s).actions.empty());
  CHECK(injector.pending());
  injector.workers_started(0, 0, 2, t0 + 3s);  // the clock is the job's: it started at t0
  CHECK(injector.poll(t0 + 3s).actions.size() == 1);
}

TEST_CASE("fault injector: a hang stops the worker and continues it after its duration") {
  FaultInjector injector(plan("hang:rank=1,after=1,duration=2;hang:rank=0,after=1"));
  injector.workers_started(0, 0, 2, t0);
  auto due = injector.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 2);
  CHECK(due.actions[0].kind == Kind::kStop);
  CHECK(due.actions[1].kind == Kind::kStop);
  CHECK(injector.stopped_workers() == std::vector<int>{0, 1});
  CHECK(injector.poll(t0 + 2s).actions.empty());
  due = injector.poll(t0 + 3s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kContinue);
  CHECK(due.actions[0].local_rank == 1);
  // Rank 0 hangs for good: nothing more to do here (the watchdog or the user ends it).
  CHECK(injector.stopped_workers() == std::vector<int>{0});
  CHECK_FALSE(injector.pending());
  injector.workers_stopped();
  CHECK(injector.stopped_workers().empty());
}

TEST_CASE("fault injector: a straggler runs its share of each period, then runs on") {
  FaultInjector injector(plan("straggler:rank=0,after=0,duration=1,speed=0.25"));
  injector.workers_started(0, 0, 1, t0);
  int stops = 0, continues = 0;
  for (auto t = 0ms; t <= 1200ms; t += 10ms) {
    for (const auto& a : injector.poll(t0 + t).actions) {
      (a.kind == Kind::kStop ? stops : continues) += 1;
      CHECK(a.local_rank == 0);
    }
  }
  CHECK(stops == 5);  // one per 200 ms period
  CHECK(continues == 5);
  CHECK(injector.stopped_workers().empty());
  CHECK_FALSE(injector.pending());
}

TEST_CASE("fault injector: a replaced worker is free of what was done to the one before") {
  FaultInjector injector(plan("hang:rank=1,after=0,duration=5"));
  injector.workers_started(0, 0, 2, t0);
  REQUIRE(injector.poll(t0).actions.size() == 1);
  injector.worker_replaced(1);
  CHECK(injector.stopped_workers().empty());
  CHECK(injector.poll(t0 + 6s).actions.empty());  // no SIGCONT to its replacement
}

TEST_CASE("fault injector: a fault at a step fires when its worker reports that step") {
  FaultInjector injector(plan("kill:rank=5,at_step=10;term:rank=1,at_step=3"));
  injector.workers_started(1, 4, 2, t0);  // ranks 4 and 5
  injector.observe_step(1, 9);
  CHECK(injector.poll(t0 + 1s).actions.empty());
  injector.observe_step(0, 50);  // another worker's step does not count
  CHECK(injector.poll(t0 + 2s).actions.empty());
  injector.observe_step(1, 11);
  auto due = injector.poll(t0 + 3s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].local_rank == 1);
  CHECK(due.fired[0].line == "fault 1: SIGKILL to rank 5 at step 10");
  // Rank 1 is another node's: this one keeps waiting, and never fires it.
  CHECK(injector.pending());
  CHECK(injector.poll(t0 + 9s).actions.empty());
  // A new process's step starts over: it must report again.
  FaultInjector again(plan("kill:rank=0,at_step=5"));
  again.workers_started(0, 0, 1, t0);
  again.observe_step(0, 4);
  again.workers_stopped();
  again.workers_started(0, 0, 1, t0 + 1s);
  CHECK(again.poll(t0 + 2s).actions.empty());
}

TEST_CASE("fault injector: a lost node is fired by that node's agent alone") {
  FaultInjector node0(plan("node_lost:node=1,after=1;node_lost:rank=1,after=2"));
  FaultInjector node1(plan("node_lost:node=1,after=1;node_lost:rank=1,after=2"));
  node0.workers_started(0, 0, 2, t0);  // ranks 0, 1
  node1.workers_started(1, 2, 2, t0);  // ranks 2, 3
  CHECK(node0.poll(t0 + 1s).actions.empty());
  auto due = node1.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kNodeLost);
  due = node0.poll(t0 + 2s);  // the node of rank 1
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kNodeLost);
  CHECK(due.fired[0].rank == 1);
}

TEST_CASE("fault injector: an exception is the worker's to raise, and ends it like a signal") {
  FaultInjector injector(plan("exception:rank=1,at_step=5;exception:rank=0,after=1"));
  injector.workers_started(0, 0, 2, t0);
  injector.observe_step(1, 4);
  CHECK(injector.poll(t0 + 100ms).actions.empty());
  injector.observe_step(1, 5);
  auto due = injector.poll(t0 + 200ms);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kRaise);
  CHECK(due.actions[0].local_rank == 1);
  REQUIRE(due.fired.size() == 1);
  CHECK(due.fired[0].ends_worker);
  CHECK(due.fired[0].line == "fault 1: an exception raised in rank 1 at step 5");
  due = injector.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kRaise);
  CHECK(due.actions[0].local_rank == 0);
  CHECK_FALSE(injector.pending());
}

TEST_CASE("fault injector: a CUDA error is the worker's to make, even while it is hung") {
  FaultInjector injector(plan("hang:rank=1,after=1,duration=5;cuda_error:rank=1,after=2"));
  injector.workers_started(0, 0, 2, t0);
  auto due = injector.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kStop);
  due = injector.poll(t0 + 2s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kRaise);
  CHECK(due.actions[0].local_rank == 1);
  REQUIRE(due.fired.size() == 1);
  CHECK(due.fired[0].kind == FaultKind::kCudaError);
  CHECK(due.fired[0].ends_worker);
  CHECK(due.fired[0].line == "fault 2: a CUDA error in rank 1 at 2.000 s");
}

TEST_CASE("fault injector: a fault asked for while the job runs counts its time from then") {
  FaultInjector injector(plan("kill:rank=0,after=100"));
  CHECK(injector.planned() == 1);
  injector.workers_started(0, 0, 2, t0);
  Fault asked = plan("term:rank=1,after=2").faults[0];
  asked.id = 2;
  injector.add(asked, t0 + 10s);
  CHECK(injector.poll(t0 + 11s).actions.empty());
  auto due = injector.poll(t0 + 12s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].signo == SIGTERM);
  CHECK(due.fired[0].fault_id == 2);
  CHECK(injector.pending());  // the planned one is still to come
}

TEST_CASE("fault injector: store latency is set off by node 0's agent alone") {
  const auto p = plan("store_latency:ms=300,duration=2,after=1");
  FaultInjector node0(p), node1(p);
  node0.workers_started(0, 0, 2, t0);
  node1.workers_started(1, 2, 2, t0);
  CHECK(node0.poll(t0 + 500ms).actions.empty());
  auto due = node0.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kStoreLatency);
  CHECK(due.actions[0].ms == 300);
  CHECK(due.actions[0].seconds == 2);
  REQUIRE(due.fired.size() == 1);
  CHECK(due.fired[0].local_rank == -1);
  CHECK_FALSE(due.fired[0].ends_worker);
  CHECK(node1.poll(t0 + 1s).actions.empty());
  CHECK_FALSE(node1.pending());
}

TEST_CASE("fault injector: a node's faults begin on that node and end after their duration") {
  const auto p = plan(
      "cut_off:node=1,after=1,duration=3;link_lost:node=1,peer=0,after=1,duration=2;"
      "disk_full:rank=1,path=/ckpt,after=1,duration=4");
  FaultInjector node0(p);
  node0.workers_started(0, 0, 2, t0);
  auto due = node0.poll(t0 + 1s);  // ranks 0-1 are node 0's: the full disk is here
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kFillDisk);
  CHECK(due.actions[0].path == "/ckpt");
  REQUIRE(due.fired.size() == 1);
  CHECK(due.fired[0].rank == -1);
  CHECK(due.fired[0].local_rank == -1);

  FaultInjector node1(p);
  node1.workers_started(1, 2, 2, t0);
  due = node1.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 2);
  CHECK(due.actions[0].kind == Kind::kCutOff);
  CHECK(due.actions[0].seconds == 3);
  CHECK(due.actions[1].kind == Kind::kLinkDown);
  CHECK(due.actions[1].peer == 0);
  // A restart of the workers does not end them: they are the node's.
  node1.workers_stopped();
  CHECK(node1.pending());
  due = node1.poll(t0 + 3s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kLinkUp);
  CHECK(due.actions[0].ends_effect);
  CHECK_FALSE(node1.pending());  // the cut-off ends by itself

  // The agent ending ends what is still in progress.
  due = node0.poll(t0 + 2s);
  CHECK(due.actions.empty());
  const auto ends = node0.end_node_faults();
  REQUIRE(ends.size() == 1);
  CHECK(ends[0].kind == Kind::kFreeDisk);
  CHECK(node0.poll(t0 + 10s).actions.empty());
}

TEST_CASE("fault injector: a rendezvous restart is the hosting agent's") {
  const auto p = plan("rendezvous_restart:after=1,duration=2");
  FaultInjector guest(p);
  guest.workers_started(0, 0, 1, t0);
  CHECK(guest.poll(t0 + 1s).actions.empty());
  FaultInjector host(p);
  host.set_hosts_rendezvous(true);
  host.workers_started(1, 1, 1, t0);
  auto due = host.poll(t0 + 1s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kStopRendezvous);
  CHECK(host.poll(t0 + 2500ms).actions.empty());
  due = host.poll(t0 + 3s);
  REQUIRE(due.actions.size() == 1);
  CHECK(due.actions[0].kind == Kind::kStartRendezvous);
}
