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
