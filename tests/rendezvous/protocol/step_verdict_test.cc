#include "rendezvous/protocol/step_verdict.h"

#include "catch.h"

using namespace ctrun::rendezvous;

TEST_CASE("step verdict: a verdict and a node's rates read back as written") {
  StepVerdict v;
  v.round = 3;
  v.factor = 2;
  v.median = 0.25;
  v.median_pace = 0.25;
  v.ranks = {{0, 0, "a", 40, 0.25, 10}, {1, 0, "a", 39, 0.75, 10}};
  v.stragglers = {1};
  auto back = step_verdict_from_json(step_verdict_json(v));
  REQUIRE(back);
  CHECK(back.value().round == 3);
  CHECK(back.value().stragglers == std::vector<int>{1});
  CHECK(back.value().slowdown(1) == 3);
  CHECK(back.value().holds(1) == 0.5);
  // A verdict of an agent that did not measure own times: its median is the pace.
  Json old = step_verdict_json(v);
  old.erase("median_own_seconds_per_step");
  auto older = step_verdict_from_json(old);
  REQUIRE(older);
  CHECK(older.value().median_pace == 0.25);
  CHECK(back.value().find(0)->host == "a");
  auto rates = node_rates_from_json(node_rates_json(4, "b", {{7, 0, "", 12, 0.5, 5}}));
  REQUIRE(rates);
  REQUIRE(rates.value().size() == 1);
  CHECK(rates.value()[0].node == 4);
  CHECK(rates.value()[0].host == "b");
  CHECK(rates.value()[0].steps == 5);
}

TEST_CASE(
    "step verdict: values of the wrong type are errors or left out, never exceptions "
    "(ctrund reads what any client of the job wrote)") {
  for (const char* text :
       {R"({"round": "x", "factor": [], "median_seconds_per_step": "y", "ranks": [],
           "stragglers": ["a", 2]})",
        R"({"ranks": [{"rank": 1, "seconds_per_step": 0.5, "node": "n", "host": 7,
           "step": 1.5, "steps": null}]})",
        R"({"ranks": {"rank": 1}})", R"({"ranks": [{"rank": "1", "seconds_per_step": 1}]})",
        R"({"ranks": [{"rank": 1, "seconds_per_step": -1}]})", R"([1, 2])", R"("text")"}) {
    INFO(text);
    const Json j = Json::parse(text, nullptr, false);
    Result<StepVerdict> v = Error{ErrorCode::kInternal, "not run"};
    CHECK_NOTHROW(v = step_verdict_from_json(j));
    CHECK_NOTHROW((void)node_rates_from_json(j));
  }
  // What has the right type is kept.
  auto v = step_verdict_from_json(
      Json::parse(R"({"round": "x", "median_seconds_per_step": "y", "ranks": [],
                      "stragglers": ["a", 2]})"));
  REQUIRE(v);
  CHECK(v.value().round == 0);
  CHECK(v.value().median == 0);
  CHECK(v.value().stragglers == std::vector<int>{2});
  auto rates = node_rates_from_json(Json::parse(
      R"({"node": "n", "ranks": [{"rank": 1, "seconds_per_step": 0.5, "host": 7, "step": 1.5}]})"));
  REQUIRE(rates);
  CHECK(rates.value()[0].node == 0);
  CHECK(rates.value()[0].step == 0);
  CHECK(rates.value()[0].seconds_per_step == 0.5);
}
