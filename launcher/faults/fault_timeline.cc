#include "launcher/faults/fault_timeline.h"
#include "launcher/cli/text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ctrun::launcher {

namespace {

using rendezvous::Json;

// The page's geometry: lanes left of the plot hold their labels.
constexpr double kLabelWidth = 120;
constexpr double kPlotWidth = 900;
constexpr double kLaneHeight = 26;
constexpr double kLaneGap = 10;
constexpr double kMarkerRoom = 18;  // above the first lane, for the markers' numbers
constexpr double kAxisRoom = 30;
constexpr double kStepsHeight = 220;
// A step kept per worker at most this often (a long job's steps would make a huge page).
constexpr double kStepSpacing = 0.05;

const char* state_class(FaultTimeline::State s) {
  switch (s) {
    case FaultTimeline::State::kRunning:
      return "running";
    case FaultTimeline::State::kDown:
      return "down";
    case FaultTimeline::State::kHung:
      return "hung";
    case FaultTimeline::State::kSlowed:
      return "slowed";
    case FaultTimeline::State::kDone:
      return "done";
  }
  return "running";
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string one_decimal(double v) { return number_text(v, "%.1f"); }

// A tick spacing that puts at most ten ticks on `span` seconds.
double tick_spacing(double span) {
  for (double step : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                      1200.0, 1800.0, 3600.0}) {
    if (span / step <= 10) return step;
  }
  return std::ceil(span / 10 / 3600) * 3600;
}

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                          "#9467bd", "#8c564b", "#e377c2", "#17becf"};

}  // namespace

double FaultTimeline::seconds(Clock::time_point at) const {
  return std::max(0.0, std::chrono::duration<double>(at - start_).count());
}

void FaultTimeline::enter(int local_rank, State state, Clock::time_point at) {
  Lane& lane = lanes_[local_rank];
  const double t = seconds(at);
  if (!lane.segments.empty() && lane.segments.back().to < 0) {
    if (lane.segments.back().state == state) return;
    lane.segments.back().to = t;
  }
  lane.segments.push_back({t, -1, state});
}

void FaultTimeline::workers_started(std::optional<int> local_rank, int rank_offset,
                                    int local_world_size, Clock::time_point at) {
  if (!started_) start_ = at;
  started_ = true;
  for (int l = 0; l < local_world_size; ++l) {
    if (local_rank && *local_rank != l) continue;
    lanes_[l].rank = rank_offset + l;
    enter(l, State::kRunning, at);
  }
}

void FaultTimeline::worker_ended(int local_rank, bool succeeded, Clock::time_point at) {
  if (started_) enter(local_rank, succeeded ? State::kDone : State::kDown, at);
}

void FaultTimeline::workers_stopped(Clock::time_point at) {
  for (auto& [local, lane] : lanes_) {
    if (!lane.segments.empty() && lane.segments.back().to < 0 &&
        lane.segments.back().state != State::kDone) {
      enter(local, State::kDown, at);
    }
  }
}

void FaultTimeline::fired(int fault_id, int local_rank, const std::string& what, State effect,
                          Clock::time_point at) {
  if (!started_) return;
  lanes_[local_rank].markers.push_back({fault_id, seconds(at), what});
  if (effect != State::kRunning) enter(local_rank, effect, at);
}

void FaultTimeline::effect_ended(int local_rank, Clock::time_point at) {
  auto lane = lanes_.find(local_rank);
  if (lane == lanes_.end() || lane->second.segments.empty()) return;
  const Segment& open = lane->second.segments.back();
  if (open.to < 0 && (open.state == State::kHung || open.state == State::kSlowed)) {
    enter(local_rank, State::kRunning, at);
  }
}

void FaultTimeline::step(int local_rank, std::int64_t step, Clock::time_point at) {
  if (!started_) return;
  Lane& lane = lanes_[local_rank];
  const double t = seconds(at);
  lane.latest = {t, step};
  // Thinned; a step below the last one kept (a restart from a checkpoint) is always kept.
  if (lane.steps.empty() || t - lane.steps.back().first >= kStepSpacing ||
      step < lane.steps.back().second) {
    lane.steps.emplace_back(t, step);
  }
}

std::string FaultTimeline::html(const Json& report, Clock::time_point end) const {
  const double span = std::max(1.0, started_ ? seconds(end) : 1.0);
  auto x = [&](double t) { return kLabelWidth + kPlotWidth * std::min(t, span) / span; };
  const double width = kLabelWidth + kPlotWidth + 20;
  const double lanes_height =
      kMarkerRoom + static_cast<double>(lanes_.size()) * (kLaneHeight + kLaneGap) + kAxisRoom;

  std::string out;
  out +=
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>ctrun fault report</title>\n<style>\n"
      "body{font-family:sans-serif;margin:20px;color:#222;background:#fff}\n"
      "h1{font-size:20px}h2{font-size:16px;margin-top:24px}\n"
      ".running{fill:#43a047}.down{fill:#e53935}.hung{fill:#fb8c00}.slowed{fill:#fdd835}"
      ".done{fill:#bdbdbd}\n"
      ".legend span{display:inline-block;width:14px;height:14px;margin:0 4px 0 14px;"
      "vertical-align:middle}\n"
      ".fault-marker line{stroke:#000;stroke-width:2}.fault-marker polygon{fill:#000}\n"
      ".axis{stroke:#888;stroke-width:1}.tick{font-size:11px;fill:#555}\n"
      ".label{font-size:12px;fill:#222}\n"
      "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;"
      "text-align:left}\n"
      "</style>\n</head>\n<body>\n";
  out += "<h1>ctrun fault report</h1>\n<p>outcome <b>" +
         escape(report.value("outcome", std::string("unknown"))) + "</b>, restarts " +
         std::to_string(report.value("restarts", 0)) + ", faults " +
         std::to_string(report.contains("faults") ? report["faults"].size() : 0) + ", " +
         one_decimal(span) + " s</p>\n";
  out +=
      "<p class=\"legend\"><span class=\"running\" style=\"background:#43a047\"></span>running"
      "<span style=\"background:#e53935\"></span>down (exited, restarting)"
      "<span style=\"background:#fb8c00\"></span>hung"
      "<span style=\"background:#fdd835\"></span>slowed"
      "<span style=\"background:#bdbdbd\"></span>done"
      "<span style=\"background:#000;width:3px\"></span>fault injected</p>\n";

  // The lanes.
  out += "<h2>Workers</h2>\n<svg id=\"lanes\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         one_decimal(width) + "\" height=\"" + one_decimal(lanes_height) + "\">\n";
  double y = kMarkerRoom;
  for (const auto& [local, lane] : lanes_) {
    // Faults of the node or the rendezvous (a cut-off, a lost link, a full disk, store latency,
    // a restarted rendezvous) have a lane of their own, with no states.
    const std::string label =
        local < 0 ? std::string("node, rendezvous")
                  : "rank " + std::to_string(lane.rank) + " (local " + std::to_string(local) + ")";
    out += "<text class=\"label\" x=\"4\" y=\"" + one_decimal(y + kLaneHeight * 0.65) + "\">" +
           label + "</text>\n";
    for (const Segment& s : lane.segments) {
      const double to = s.to < 0 ? span : s.to;
      // A restart takes milliseconds: its gap is drawn wide enough to be seen.
      const double least = s.state == State::kDown ? 3.0 : 1.0;
      out += "<rect class=\"" + std::string(state_class(s.state)) + "\" x=\"" +
             one_decimal(x(s.from)) + "\" y=\"" + one_decimal(y) + "\" width=\"" +
             one_decimal(std::max(least, x(to) - x(s.from))) + "\" height=\"" +
             one_decimal(kLaneHeight) + "\"><title>" + state_class(s.state) + " " +
             one_decimal(s.from) + "-" + one_decimal(to) + " s</title></rect>\n";
    }
    for (const Marker& m : lane.markers) {
      const double mx = x(m.at);
      out += "<g class=\"fault-marker\" data-fault=\"" + std::to_string(m.fault_id) + "\"><title>" +
             escape(m.what) + " (" + one_decimal(m.at) + " s)</title><line x1=\"" +
             one_decimal(mx) + "\" x2=\"" + one_decimal(mx) + "\" y1=\"" + one_decimal(y - 4) +
             "\" y2=\"" + one_decimal(y + kLaneHeight + 4) + "\"/><polygon points=\"" +
             one_decimal(mx - 5) + "," + one_decimal(y - 10) + " " + one_decimal(mx + 5) + "," +
             one_decimal(y - 10) + " " + one_decimal(mx) + "," + one_decimal(y - 3) +
             "\"/><text class=\"tick\" x=\"" + one_decimal(mx + 6) + "\" y=\"" +
             one_decimal(y - 4) + "\">" + std::to_string(m.fault_id) + "</text></g>\n";
    }
    y += kLaneHeight + kLaneGap;
  }
  const double tick = tick_spacing(span);
  out += "<line class=\"axis\" x1=\"" + one_decimal(kLabelWidth) + "\" x2=\"" +
         one_decimal(kLabelWidth + kPlotWidth) + "\" y1=\"" + one_decimal(y) + "\" y2=\"" +
         one_decimal(y) + "\"/>\n";
  for (double t = 0; t <= span + 1e-9; t += tick) {
    out += "<text class=\"tick\" x=\"" + one_decimal(x(t) - 6) + "\" y=\"" + one_decimal(y + 16) +
           "\">" + one_decimal(t) + " s</text>\n";
  }
  out += "</svg>\n";

  // The steps.
  std::int64_t max_step = 1;
  for (const auto& [local, lane] : lanes_) {
    for (const auto& [t, s] : lane.steps) max_step = std::max(max_step, s);
    max_step = std::max(max_step, lane.latest.second);
  }
  auto sy = [&](std::int64_t s) {
    return 10 +
           (kStepsHeight - 20) * (1.0 - static_cast<double>(s) / static_cast<double>(max_step));
  };
  out +=
      "<h2>Steps reported</h2>\n<svg id=\"steps\" xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"" +
      one_decimal(width) + "\" height=\"" + one_decimal(kStepsHeight + kAxisRoom) + "\">\n";
  out += "<text class=\"tick\" x=\"4\" y=\"" + one_decimal(sy(max_step) + 4) + "\">step " +
         std::to_string(max_step) + "</text>\n<text class=\"tick\" x=\"4\" y=\"" +
         one_decimal(sy(0) + 4) + "\">step 0</text>\n";
  std::size_t color = 0;
  for (const auto& [local, lane] : lanes_) {
    const char* stroke = kPalette[color++ % (sizeof kPalette / sizeof kPalette[0])];
    if (!lane.steps.empty()) {
      out += "<polyline fill=\"none\" stroke=\"" + std::string(stroke) +
             "\" stroke-width=\"2\" points=\"";
      for (const auto& [t, s] : lane.steps)
        out += one_decimal(x(t)) + "," + one_decimal(sy(s)) + " ";
      if (lane.latest != lane.steps.back()) {
        out += one_decimal(x(lane.latest.first)) + "," + one_decimal(sy(lane.latest.second)) + " ";
      }
      out += "\"><title>rank " + std::to_string(lane.rank) + "</title></polyline>\n";
    }
    for (const Marker& m : lane.markers) {
      out += "<line stroke=\"#000\" stroke-dasharray=\"4 3\" x1=\"" + one_decimal(x(m.at)) +
             "\" x2=\"" + one_decimal(x(m.at)) + "\" y1=\"10\" y2=\"" +
             one_decimal(kStepsHeight - 10) + "\"/>\n";
    }
  }
  out += "<line class=\"axis\" x1=\"" + one_decimal(kLabelWidth) + "\" x2=\"" +
         one_decimal(kLabelWidth + kPlotWidth) + "\" y1=\"" + one_decimal(kStepsHeight - 10) +
         "\" y2=\"" + one_decimal(kStepsHeight - 10) + "\"/>\n";
  for (double t = 0; t <= span + 1e-9; t += tick) {
    out += "<text class=\"tick\" x=\"" + one_decimal(x(t) - 6) + "\" y=\"" +
           one_decimal(kStepsHeight + 6) + "\">" + one_decimal(t) + " s</text>\n";
  }
  color = 0;
  double legend_x = kLabelWidth;
  for (const auto& [local, lane] : lanes_) {
    const char* fill = kPalette[color++ % (sizeof kPalette / sizeof kPalette[0])];
    if (local < 0) continue;  // the rendezvous reports no steps
    out += "<text class=\"label\" fill=\"" + std::string(fill) + "\" style=\"fill:" + fill +
           "\" x=\"" + one_decimal(legend_x) + "\" y=\"" + one_decimal(kStepsHeight + 24) +
           "\">rank " + std::to_string(lane.rank) + "</text>\n";
    legend_x += 70;
  }
  out += "</svg>\n";

  // The report's figures.
  out +=
      "<h2>Faults</h2>\n<table id=\"faults\">\n<tr><th>fault</th><th>rank</th><th>what</th>"
      "<th>worker exit (ms)</th><th>running again (ms)</th><th>first step</th>"
      "<th>after (ms)</th><th>steps redone</th></tr>\n";
  auto cell = [](const Json& f, const char* key) {
    return f.contains(key) ? escape(f[key].dump()) : std::string("-");
  };
  if (report.contains("faults")) {
    for (const auto& f : report["faults"]) {
      out += "<tr><td>" + cell(f, "fault") + "</td><td>" + cell(f, "rank") + "</td><td>" +
             escape(f.value("what", std::string())) + "</td><td>" + cell(f, "worker_exit_ms") +
             "</td><td>" + cell(f, "running_again_ms") + "</td><td>" + cell(f, "first_step") +
             "</td><td>" + cell(f, "first_step_ms") + "</td><td>" + cell(f, "steps_redone") +
             "</td></tr>\n";
    }
  }
  out += "</table>\n";
  if (report.contains("results") && !report["results"].empty()) {
    out += "<h2>Results</h2>\n<table id=\"results\">\n<tr><th>rank</th><th>result</th></tr>\n";
    for (const auto& [rank, result] : report["results"].items()) {
      out += "<tr><td>" + escape(rank) + "</td><td>" +
             escape(result.is_string() ? result.get<std::string>() : result.dump()) +
             "</td></tr>\n";
    }
    out += "</table>\n";
  }
  // The report itself, for tools ("</" cannot end the script early).
  std::string embedded = report.dump();
  for (std::size_t at = embedded.find("</"); at != std::string::npos;
       at = embedded.find("</", at + 3)) {
    embedded.replace(at, 2, "<\\/");
  }
  out += "<script type=\"application/json\" id=\"fault-report\">" + embedded + "</script>\n";
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace ctrun::launcher
