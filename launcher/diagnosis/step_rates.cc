#include "launcher/diagnosis/step_rates.h"

#include <algorithm>

namespace ctrun::launcher {

namespace {

double seconds(std::int64_t ns) { return static_cast<double>(ns) / 1e9; }
double seconds(StepRates::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void StepRates::reset(int workers) {
  workers_.assign(static_cast<std::size_t>(std::max(workers, 0)), {});
}

void StepRates::restart(int local_rank) {
  if (local_rank >= 0 && static_cast<std::size_t>(local_rank) < workers_.size()) {
    workers_[static_cast<std::size_t>(local_rank)] = {};
  }
}

void StepRates::observe(int local_rank, std::int64_t step, Clock::time_point now,
                        std::optional<std::int64_t> waited_ns) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  auto& worker = workers_[static_cast<std::size_t>(local_rank)];
  auto& points = worker.points;
  if (!points.empty() && step == points.back().step) return;
  if (!points.empty() && step < points.back().step) points.clear();  // resumed from earlier
  points.push_back({step, now, waited_ns, worker.os});
  // Kept: the last `window` steps, and the point they are measured from.
  while (points.size() > 2 && points[1].step <= step - window_) points.pop_front();
}

void StepRates::observe_process(int local_rank, std::int64_t cpu_ns, std::int64_t run_delay_ns,
                                bool stopped, Clock::time_point now) {
  if (local_rank < 0 || static_cast<std::size_t>(local_rank) >= workers_.size()) return;
  Counters& os = workers_[static_cast<std::size_t>(local_rank)].os;
  if (os.known && stopped) os.stopped_ns += std::chrono::nanoseconds(now - os.at).count();
  os.known = true;
  os.cpu_ns = cpu_ns;
  os.run_delay_ns = run_delay_ns;
  os.at = now;
}

std::vector<StepRates::Rate> StepRates::rates(Clock::time_point now) const {
  std::vector<Rate> out;
  const std::int64_t needed = std::min<std::int64_t>(kMinSteps, window_);
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    const auto& points = workers_[i].points;
    if (points.size() < 2) continue;
    const Point& first = points.front();
    const Point& last = points.back();
    const std::int64_t steps = last.step - first.step;
    if (steps < needed) continue;
    const double span = seconds(last.at - first.at);
    const double average = span / static_cast<double>(steps);
    // The step under way, once longer than the average, counts as one more step of the window:
    // a stuck rank grows slow at once, a single hiccup barely moves it.
    const double under_way = seconds(now - last.at);
    const bool stuck = under_way > average;
    const double counted = stuck ? span + under_way : span;
    const double n = static_cast<double>(stuck ? steps + 1 : steps);
    Rate rate{static_cast<int>(i), last.step, counted / n, steps};
    // Own times are of whole steps only: in a synchronous job a rank stuck in a step holds its
    // peers' steps too (the hang report's case), and a rank whose script has ended its last step
    // is not slow.
    double own = span;
    if (first.waited_ns && last.waited_ns && *last.waited_ns >= *first.waited_ns) {
      const double waited = std::min(seconds(*last.waited_ns - *first.waited_ns), span);
      own = span - waited;
      rate.wait_seconds_per_step = waited / static_cast<double>(steps);
      rate.own_seconds_per_step = own / static_cast<double>(steps);
    }
    if (first.os.known && last.os.known && own > 0) {
      auto share = [own](double part) { return std::clamp(part / own, 0.0, 1.0); };
      rate.cpu_share = share(seconds(last.os.cpu_ns - first.os.cpu_ns));
      rate.run_delay_share = share(seconds(last.os.run_delay_ns - first.os.run_delay_ns));
      rate.stopped_share = share(seconds(last.os.stopped_ns - first.os.stopped_ns));
      rate.cpu_seconds_per_step =
          seconds(last.os.cpu_ns - first.os.cpu_ns) / static_cast<double>(steps);
    }
    out.push_back(rate);
  }
  return out;
}

std::string own_time_kind(const StepRates::Rate& rate) {
  if (!rate.cpu_share || !rate.run_delay_share || !rate.stopped_share) return "";
  const double stopped = *rate.stopped_share;
  const double cpu = *rate.cpu_share;
  const double delay = *rate.run_delay_share;
  const double off_cpu = std::max(0.0, 1.0 - cpu - delay - stopped);
  if (stopped >= 0.25 || (stopped >= cpu && stopped >= delay && stopped >= off_cpu)) {
    return kStopped;
  }
  if (delay >= cpu && delay >= off_cpu) return kWaitingForCpu;
  if (cpu >= off_cpu) return kOwnCompute;
  return kWaitingForInput;
}

}  // namespace ctrun::launcher
