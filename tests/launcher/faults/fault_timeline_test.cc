#include "launcher/faults/fault_timeline.h"

#include "catch.h"

#include "process.h"

using namespace ctrun::launcher;
using namespace std::chrono_literals;
using Json = ctrun::rendezvous::Json;
using State = FaultTimeline::State;

namespace {
const FaultTimeline::Clock::time_point t0 = FaultTimeline::Clock::time_point{} + 1000h;
}

TEST_CASE("fault timeline: lanes by state, a marker per fault, the steps and the report") {
  FaultTimeline t;
  t.workers_started(std::nullopt, 4, 2, t0);  // ranks 4 and 5
  t.step(0, 1, t0 + 100ms);
  t.step(0, 2, t0 + 120ms);  // within 50 ms of the last kept: thinned, yet the last is drawn
  t.fired(1, 1, "fault 1: <SIGKILL> to rank 5", State::kRunning, t0 + 1s);
  t.worker_ended(1, false, t0 + 1010ms);
  t.workers_stopped(t0 + 1020ms);  // the restart stops rank 4 too
  t.workers_started(std::nullopt, 4, 2, t0 + 2s);
  t.fired(2, 0, "fault 2: rank 4 hung", State::kHung, t0 + 3s);
  t.effect_ended(0, t0 + 4s);
  t.step(0, 1, t0 + 4500ms);  // resumed from a checkpoint: kept
  t.worker_ended(1, true, t0 + 4800ms);
  const Json report{{"outcome", "succeeded"},
                    {"restarts", 1},
                    {"faults", Json::array({Json{{"fault", 1}, {"what", "x</script>y"}}})},
                    {"results", Json{{"4", "abc"}}}};
  const std::string page = t.html(report, t0 + 5s);
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(ctrun::testing::count_of(page, "class=\"fault-marker\"") == 2);
  CHECK(page.find("data-fault=\"1\"") != std::string::npos);
  CHECK(page.find("data-fault=\"2\"") != std::string::npos);
  CHECK(page.find("rank 4 (local 0)") != std::string::npos);
  CHECK(page.find("rank 5 (local 1)") != std::string::npos);
  // Lane 0: running, down, running, hung, running; lane 1: running, down, running, done.
  CHECK(ctrun::testing::count_of(page, "<rect class=\"running\"") == 5);
  CHECK(ctrun::testing::count_of(page, "<rect class=\"down\"") == 2);
  CHECK(ctrun::testing::count_of(page, "<rect class=\"hung\"") == 1);
  CHECK(ctrun::testing::count_of(page, "<rect class=\"done\"") == 1);
  CHECK(page.find("&lt;SIGKILL&gt;") != std::string::npos);  // text is escaped
  CHECK(page.find("<SIGKILL>") == std::string::npos);
  // The report, embedded whole: "</" cannot close its script early.
  const auto open = page.find("<script type=\"application/json\" id=\"fault-report\">");
  REQUIRE(open != std::string::npos);
  const auto body =
      open + std::string("<script type=\"application/json\" id=\"fault-report\">").size();
  std::string embedded = page.substr(body, page.find("</script>", body) - body);
  for (auto at = embedded.find("<\\/"); at != std::string::npos; at = embedded.find("<\\/", at))
    embedded.replace(at, 3, "</");
  CHECK(Json::parse(embedded) == report);
  CHECK(page.find("<td>abc</td>") != std::string::npos);
}

TEST_CASE("fault timeline: before any worker started, a page with no lanes") {
  FaultTimeline t;
  const std::string page = t.html(Json{{"outcome", "failed"}}, t0);
  CHECK(ctrun::testing::count_of(page, "class=\"fault-marker\"") == 0);
  CHECK(page.find("outcome <b>failed</b>") != std::string::npos);
}
