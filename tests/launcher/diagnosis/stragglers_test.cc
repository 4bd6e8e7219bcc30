#include "launcher/diagnosis/stragglers.h"

#include <catch2/catch.hpp>

#include "launcher/diagnosis/step_rates.h"

namespace ctrun::launcher {
namespace {

using namespace std::chrono_literals;
using Clock = StepRates::Clock;

RankRate rate(int rank, int node, double seconds_per_step, std::int64_t steps = 50) {
  return RankRate{rank, node, "host" + std::to_string(node), 100, seconds_per_step, steps};
}

}  // namespace

TEST_CASE("step rates: the time per step over the last window, a slow step under way counted") {
  StepRates rates(10);
  rates.reset(2);
  const auto t0 = Clock::time_point{} + 1000s;
  // Rank 0 steps every 100 ms; rank 1 every 300 ms.
  for (int i = 0; i <= 20; ++i) rates.observe(0, i, t0 + i * 100ms);
  for (int i = 0; i <= 6; ++i) rates.observe(1, i, t0 + i * 300ms);
  auto now = t0 + 2000ms;
  auto got = rates.rates(now);
  REQUIRE(got.size() == 2);
  CHECK(got[0].local_rank == 0);
  CHECK(got[0].steps == 10);  // the window, not all 20
  CHECK(got[0].seconds_per_step == Approx(0.1));
  CHECK(got[1].steps == 6);
  CHECK(got[1].seconds_per_step == Approx(0.3));
  // Rank 0 stuck in step 21 for 2 s: one more step of 2 s in its window, before it ends.
  now = t0 + 4000ms;
  got = rates.rates(now);
  CHECK(got[0].seconds_per_step == Approx(3.0 / 11));
  // A step just over the average barely moves it.
  CHECK(rates.rates(t0 + 2150ms)[0].seconds_per_step == Approx(1.15 / 11));
}

TEST_CASE("step rates: too few steps give no rate, a step back or a new worker starts afresh") {
  StepRates rates(50);
  rates.reset(1);
  const auto t0 = Clock::time_point{} + 1000s;
  for (int i = 0; i < StepRates::kMinSteps; ++i) rates.observe(0, i, t0 + i * 100ms);
  CHECK(rates.rates(t0 + 500ms).empty());  // 4 steps past the first reading
  rates.observe(0, StepRates::kMinSteps, t0 + 500ms);
  REQUIRE(rates.rates(t0 + 500ms).size() == 1);
  rates.observe(0, 1, t0 + 600ms);  // resumed from a checkpoint
  CHECK(rates.rates(t0 + 600ms).empty());
  for (int i = 2; i < 10; ++i) rates.observe(0, i, t0 + 600ms + (i - 1) * 100ms);
  REQUIRE(rates.rates(t0 + 1500ms).size() == 1);
  rates.restart(0);
  CHECK(rates.rates(t0 + 1500ms).empty());
  // A jump of several steps between two readings (steps faster than the agent reads) is
  // several steps.
  rates.observe(0, 100, t0 + 2s);
  rates.observe(0, 120, t0 + 3s);
  auto got = rates.rates(t0 + 3s);
  REQUIRE(got.size() == 1);
  CHECK(got[0].seconds_per_step == Approx(0.05));
}

TEST_CASE("stragglers: a rank slower than the median by the factor is named, none otherwise") {
  std::vector<RankRate> even;
  for (int r = 0; r < 8; ++r) even.push_back(rate(r, r / 4, 0.10 + 0.01 * (r % 3)));
  auto v = judge_steps(even, 2.0, 3);
  CHECK(v.stragglers.empty());
  CHECK(v.straggler_nodes.empty());
  CHECK(v.median == Approx(0.11));

  auto slow = even;
  slow[5].seconds_per_step = 0.30;
  v = judge_steps(slow, 2.0, 3);
  CHECK(v.stragglers == std::vector<int>{5});
  CHECK(v.straggler_nodes.empty());
  CHECK(v.slowdown(5) == Approx(0.30 / v.median));
  CHECK(v.round == 3);

  // One rank, or none: no median to compare with.
  CHECK(judge_steps({rate(0, 0, 5.0)}, 2.0, 0).stragglers.empty());
  CHECK(judge_steps({}, 2.0, 0).median == 0);
}

TEST_CASE("stragglers: a node whose every rank is slow is named as the node") {
  std::vector<RankRate> ranks;
  for (int r = 0; r < 12; ++r) ranks.push_back(rate(r, r / 4, r / 4 == 1 ? 0.5 : 0.2));
  const auto v = judge_steps(ranks, 2.0, 0);
  CHECK(v.stragglers == std::vector<int>{4, 5, 6, 7});
  CHECK(v.straggler_nodes == std::vector<int>{1});
  StragglerLog log;
  auto said = log.take(v);
  REQUIRE(said.size() == 1);
  CHECK(said[0].straggling);
  CHECK(said[0].node == 1);
  CHECK(said[0].ranks == std::vector<int>{4, 5, 6, 7});
  CHECK(said[0].line ==
        "node 1 (host1), ranks 4-7, is 2.5x slower than the median for the last 50 steps "
        "(0.500 s/step against the median's 0.200 s)");
  CHECK(log.take(v).empty());  // told once
}

TEST_CASE("stragglers: each change told once, back at the pace told, a new round afresh") {
  std::vector<RankRate> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(rate(r, r / 2, 0.1));
  ranks[3].seconds_per_step = 0.24;
  StragglerLog log;
  auto said = log.take(judge_steps(ranks, 2.0, 1));
  REQUIRE(said.size() == 1);
  CHECK(said[0].line ==
        "rank 3 on host1 is 2.4x slower than the median for the last 50 steps (0.240 s/step "
        "against the median's 0.100 s)");
  CHECK(log.take(judge_steps(ranks, 2.0, 1)).empty());
  // Just under the factor: not yet back (a rank on the line is not named and cleared in turn).
  ranks[3].seconds_per_step = 0.19;
  CHECK(log.take(judge_steps(ranks, 2.0, 1)).empty());
  ranks[3].seconds_per_step = 0.11;
  said = log.take(judge_steps(ranks, 2.0, 1));
  REQUIRE(said.size() == 1);
  CHECK_FALSE(said[0].straggling);
  CHECK(said[0].line == "rank 3 on host1 is back to the job's pace (1.1x the median)");
  // Slow again in the next round: named again.
  ranks[3].seconds_per_step = 0.5;
  CHECK(log.take(judge_steps(ranks, 2.0, 1)).size() == 1);
  CHECK(log.take(judge_steps(ranks, 2.0, 2)).size() == 1);
}

TEST_CASE("stragglers: the store's JSON read back, a bad value an error naming the field") {
  const std::vector<RankRate> mine{rate(4, 1, 0.2, 30), rate(5, 1, 0.6, 30)};
  auto back = node_rates_from_json(node_rates_json(1, "gpu07", mine));
  REQUIRE(back.ok());
  REQUIRE(back.value().size() == 2);
  CHECK(back.value()[1].host == "gpu07");
  CHECK(back.value()[1].seconds_per_step == Approx(0.6));

  std::vector<RankRate> all = mine;
  all.push_back(rate(0, 0, 0.2));
  all.push_back(rate(1, 0, 0.2));
  const auto v = judge_steps(all, 2.0, 7);
  auto read = step_verdict_from_json(step_verdict_json(v));
  REQUIRE(read.ok());
  CHECK(read.value().round == 7);
  CHECK(read.value().stragglers == std::vector<int>{5});
  CHECK(read.value().median == Approx(v.median));
  CHECK(read.value().find(5) != nullptr);

  auto bad = node_rates_from_json(rendezvous::Json::parse(
      R"({"node": 1, "ranks": [{"rank": 1, "seconds_per_step": "fast"}]})"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("seconds_per_step") != std::string::npos);
  CHECK_FALSE(step_verdict_from_json(rendezvous::Json::parse("[1, 2]")).ok());
}

}  // namespace ctrun::launcher

namespace ctrun::launcher {
namespace {

// A rank of a synchronous job: every step 0.25 s, of which `own` its own and the rest waited.
RankRate synced(int rank, int node, double own, std::string kind = "its own compute") {
  RankRate r = rate(rank, node, 0.25);
  r.own_seconds_per_step = own;
  r.wait_seconds_per_step = 0.25 - own;
  r.kind = std::move(kind);
  return r;
}

}  // namespace

TEST_CASE("step rates: a worker's own time is its step less its waits, the OS says on what") {
  StepRates rates(10);
  rates.reset(2);
  const auto t0 = Clock::time_point{} + 1000s;
  // Both step every 250 ms. Rank 0 waits 220 ms of each for rank 1; rank 1 spends 200 ms of its
  // own 240 ms on a CPU, 20 ms waiting for one.
  for (int i = 0; i <= 10; ++i) {
    const auto at = t0 + i * 250ms;
    rates.observe_process(0, i * 30'000'000LL, 0, false, at);
    rates.observe_process(1, i * 200'000'000LL, i * 20'000'000LL, false, at);
    rates.observe(0, i, at, i * 220'000'000LL);
    rates.observe(1, i, at, i * 10'000'000LL);
  }
  auto got = rates.rates(t0 + 2500ms);
  REQUIRE(got.size() == 2);
  CHECK(got[0].seconds_per_step == Approx(0.25));
  CHECK(got[1].seconds_per_step == Approx(0.25));
  REQUIRE(got[0].own_seconds_per_step);
  CHECK(*got[0].own_seconds_per_step == Approx(0.03));
  CHECK(*got[0].wait_seconds_per_step == Approx(0.22));
  CHECK(*got[1].own_seconds_per_step == Approx(0.24));
  CHECK(*got[1].cpu_share == Approx(0.2 / 0.24));
  CHECK(*got[1].run_delay_share == Approx(0.02 / 0.24));
  CHECK(own_time_kind(got[1]) == "its own compute");
  CHECK(own_time_kind(got[0]) == "its own compute");  // its 30 ms on the CPU

  // A worker without a wait measure has no own time; one without /proc readings no kind.
  StepRates plain(10);
  plain.reset(1);
  for (int i = 0; i <= 10; ++i) plain.observe(0, i, t0 + i * 100ms);
  auto p = plain.rates(t0 + 1000ms);
  REQUIRE(p.size() == 1);
  CHECK_FALSE(p[0].own_seconds_per_step);
  CHECK_FALSE(p[0].cpu_share);
  CHECK(own_time_kind(p[0]).empty());
}

TEST_CASE("step rates: the kind of a rank's own time: input, stopped, waiting for a CPU") {
  const auto t0 = Clock::time_point{} + 1000s;
  auto kind_of = [t0](std::int64_t cpu_ns, std::int64_t delay_ns, int stopped_every) {
    StepRates rates(10);
    rates.reset(1);
    // 10 steps of 100 ms, no waits; the OS read every 50 ms.
    for (int i = 0; i <= 20; ++i) {
      const auto at = t0 + i * 50ms;
      rates.observe_process(0, i * cpu_ns / 2, i * delay_ns / 2,
                            stopped_every > 0 && i % stopped_every == 0, at);
      if (i % 2 == 0) rates.observe(0, i / 2, at, 0);
    }
    auto got = rates.rates(t0 + 1000ms);
    REQUIRE(got.size() == 1);
    return own_time_kind(got[0]);
  };
  CHECK(kind_of(90'000'000, 0, 0) == "its own compute");
  CHECK(kind_of(10'000'000, 0, 0) == "waiting for input");  // a sleep, a data loader
  CHECK(kind_of(20'000'000, 60'000'000, 0) == "not running: waiting for a CPU");
  CHECK(kind_of(40'000'000, 0, 2) == "not running: stopped");  // stopped half the time
}

TEST_CASE(
    "stragglers: in a synchronous job the rank the others wait for is named by its own time") {
  // Every rank's step takes 0.25 s: the step times name nobody, the own times rank 3.
  const StepVerdict v = judge_steps({synced(0, 0, 0.03), synced(1, 0, 0.03), synced(2, 1, 0.032),
                                     synced(3, 1, 0.245, "waiting for input")},
                                    2.0, 1);
  CHECK(v.median == Approx(0.25));
  CHECK(v.median_pace == Approx(0.03));
  CHECK(v.stragglers == std::vector<int>{3});
  CHECK(v.straggler_nodes.empty());
  CHECK(v.holds(3) == Approx(0.215));
  StragglerLog log;
  const auto changes = log.take(v);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].line ==
        "rank 3 on host1 holds every step for 0.21 s of 0.25 s (waiting for input; its own time "
        "0.24 s a step against the job's 0.030 s, 8.2x, over the last 50 steps)");

  // A whole node of a two-node job: half the ranks; the lower median is the job's pace.
  const StepVerdict node = judge_steps(
      {synced(0, 0, 0.03), synced(1, 0, 0.03), synced(2, 1, 0.2), synced(3, 1, 0.21)}, 2.0, 1);
  CHECK(node.stragglers == std::vector<int>{2, 3});
  CHECK(node.straggler_nodes == std::vector<int>{1});
  StragglerLog node_log;
  const auto named = node_log.take(node);
  REQUIRE(named.size() == 1);
  CHECK(named[0].node == 1);
  CHECK(named[0].line.find("node 1 (host1), ranks 2-3, holds every step for 0.18 s of 0.25 s") ==
        0);

  // On a busy machine a rank with more work waits for a CPU longer than it computes: it is
  // still its own compute when it computes `factor` times what the others do, by a fifth of the
  // step or more.
  std::vector<RankRate> busy = {synced(0, 0, 0.03), synced(1, 0, 0.03), synced(2, 1, 0.03),
                                synced(3, 1, 0.2, "not running: waiting for a CPU")};
  for (auto& r : busy) r.cpu_seconds_per_step = r.rank == 3 ? 0.07 : 0.01;
  CHECK(judge_steps(busy, 2.0, 1).find(3)->kind == "its own compute");
  busy[3].cpu_seconds_per_step = 0.02;  // descheduled, not more work
  CHECK(judge_steps(busy, 2.0, 1).find(3)->kind == "not running: waiting for a CPU");

  // A clean job: own times of a few milliseconds that differ by twice are noise, not a straggler.
  const StepVerdict clean = judge_steps(
      {synced(0, 0, 0.004), synced(1, 0, 0.009), synced(2, 1, 0.005), synced(3, 1, 0.004)}, 2.0, 1);
  CHECK(clean.stragglers.empty());
}

TEST_CASE("stragglers: own times, waits and kinds carried through the store's JSON") {
  StepVerdict v =
      judge_steps({synced(0, 0, 0.03), synced(1, 1, 0.24, "not running: stopped")}, 2.0, 3);
  const rendezvous::Json node =
      node_rates_json(1, "host1", {synced(1, 1, 0.24, "not running: stopped")});
  auto back = node_rates_from_json(node);
  REQUIRE(back);
  REQUIRE(back.value().size() == 1);
  CHECK(back.value()[0].own_seconds_per_step == Approx(0.24));
  CHECK(back.value()[0].wait_seconds_per_step == Approx(0.01));
  CHECK(back.value()[0].kind == "not running: stopped");
  auto verdict = step_verdict_from_json(step_verdict_json(v));
  REQUIRE(verdict);
  CHECK(verdict.value().median_pace == Approx(0.03));
  CHECK(verdict.value().stragglers == std::vector<int>{1});
  CHECK(verdict.value().holds(1) == Approx(0.21));
  rendezvous::Json bad = node;
  bad["ranks"][0]["own_seconds_per_step"] = "fast";
  auto error = node_rates_from_json(bad);
  REQUIRE_FALSE(error);
  CHECK(error.error().message == "rank 1: 'own_seconds_per_step' is not a time");
}

}  // namespace ctrun::launcher

namespace ctrun::launcher {

TEST_CASE("step rates: own times are of whole steps: a rank past its last step is not slow") {
  StepRates rates(10);
  rates.reset(1);
  const auto t0 = Clock::time_point{} + 1000s;
  for (int i = 0; i <= 10; ++i) rates.observe(0, i, t0 + i * 100ms, i * 60'000'000LL);
  // Its script ended step 10 and the worker lingers (a group destroyed, an exit): 2 s later its
  // step time grows, its own time does not.
  const auto got = rates.rates(t0 + 3000ms);
  REQUIRE(got.size() == 1);
  CHECK(got[0].seconds_per_step == Approx(3.0 / 11));
  CHECK(*got[0].own_seconds_per_step == Approx(0.04));
  CHECK(*got[0].wait_seconds_per_step == Approx(0.06));
}

}  // namespace ctrun::launcher
