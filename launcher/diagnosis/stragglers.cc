#include "launcher/diagnosis/stragglers.h"
#include "launcher/cli/text.h"
#include "launcher/diagnosis/step_rates.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

// A straggler is back at the job's pace below this share of the factor, so that a rank near
// the line is not named and cleared at every verdict.
constexpr double kBackBelow = 0.9;

// A rank that keeps the others waiting for less than this share of the job's step is not named,
// however many times the median pace its own time is: in a synchronous job the fast ranks' own
// time is small, and a few milliseconds of noise on it (or the verdict's ranks measured an
// interval apart as a slowdown ends) would double it. A rank twice the job's pace in a
// synchronous job holds about half of every step.
constexpr double kMinHoldShare = 0.2;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The lower of the two middle values for an even count: with half the ranks slow (a whole node
// of a two-node job), the other half set the job's pace.
double lower_median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

std::string seconds_text(double s) { return number_text(s, s < 0.1 ? "%.3f" : "%.2f") + " s"; }

std::string where(const RankRate& r) {
  return "rank " + std::to_string(r.rank) + (r.host.empty() ? "" : " on " + r.host);
}

}  // namespace

StepVerdict judge_steps(std::vector<RankRate> ranks, double factor, int round) {
  StepVerdict v;
  v.round = round;
  v.factor = factor;
  std::sort(ranks.begin(), ranks.end(),
            [](const RankRate& a, const RankRate& b) { return a.rank < b.rank; });
  ranks.erase(std::unique(ranks.begin(), ranks.end(),
                          [](const RankRate& a, const RankRate& b) { return a.rank == b.rank; }),
              ranks.end());
  v.ranks = std::move(ranks);
  if (v.ranks.size() < 2) return v;
  std::vector<double> times, paces;
  for (const auto& r : v.ranks) {
    times.push_back(r.seconds_per_step);
    paces.push_back(r.pace());
  }
  v.median = median_of(std::move(times));
  v.median_pace = lower_median_of(std::move(paces));
  if (v.median <= 0 || v.median_pace <= 0 || factor <= 0) return v;
  std::map<int, std::pair<int, int>> per_node;  // node -> (ranks, stragglers)
  for (const auto& r : v.ranks) {
    const bool slow =
        r.pace() >= factor * v.median_pace && r.pace() - v.median_pace >= kMinHoldShare * v.median;
    if (slow) v.stragglers.push_back(r.rank);
    auto& [all, slow_ones] = per_node[r.node];
    ++all;
    slow_ones += slow ? 1 : 0;
  }
  for (const auto& [node, counts] : per_node) {
    if (counts.first > 1 && counts.first == counts.second) v.straggler_nodes.push_back(node);
  }
  // Its own node saw a straggler wait for a CPU more than it computed; on a busy machine that
  // is also what a rank with more work than the others sees: its own compute, where its CPU time
  // a step is `factor` times the job's median, by a fifth of the step or more.
  std::vector<double> cpus;
  for (const auto& r : v.ranks) {
    if (r.cpu_seconds_per_step) cpus.push_back(*r.cpu_seconds_per_step);
  }
  if (cpus.empty()) return v;
  const double median_cpu = median_of(std::move(cpus));
  for (auto& r : v.ranks) {
    if (r.kind == kWaitingForCpu && r.cpu_seconds_per_step &&
        std::binary_search(v.stragglers.begin(), v.stragglers.end(), r.rank) &&
        *r.cpu_seconds_per_step >= factor * median_cpu &&
        *r.cpu_seconds_per_step - median_cpu >= kMinHoldShare * v.median) {
      r.kind = kOwnCompute;
    }
  }
  return v;
}

std::vector<StragglerLog::Change> StragglerLog::take(const StepVerdict& v) {
  if (v.round != round_) {
    round_ = v.round;
    ranks_.clear();
    nodes_.clear();
  }
  std::vector<Change> out;
  auto pace = [&v](const RankRate& r) {
    return number_text(r.seconds_per_step, "%.3f") + " s/step against the median's " +
           number_text(v.median, "%.3f") + " s";
  };
  // Where the ranks measure their waits (a synchronous job): how long the rank keeps the others
  // waiting in each step, and on what.
  auto holds = [&v](const RankRate& r, std::int64_t steps) {
    return " holds every step for " + seconds_text(std::max(0.0, r.pace() - v.median_pace)) +
           " of " + seconds_text(r.seconds_per_step) + " (" +
           (r.kind.empty() ? "" : r.kind + "; ") + "its own time " + seconds_text(r.pace()) +
           " a step against the job's " + seconds_text(v.median_pace) + ", " +
           number_text(r.pace() / v.median_pace, "%.1f") + "x, over the last " +
           std::to_string(steps) + " steps)";
  };
  // Whole nodes first: their ranks are then not named one by one.
  std::set<int> in_slow_nodes;
  for (int node : v.straggler_nodes) {
    std::vector<int> ranks;
    const RankRate* sample = nullptr;
    double slowest = 0;
    std::int64_t steps = 0;
    for (const auto& r : v.ranks) {
      if (r.node != node) continue;
      ranks.push_back(r.rank);
      in_slow_nodes.insert(r.rank);
      if (!sample || r.pace() > slowest) {
        sample = &r;
        slowest = r.pace();
      }
      steps = std::max(steps, r.steps);
    }
    if (nodes_.count(node) || !sample) continue;
    nodes_.insert(node);
    for (int r : ranks) ranks_.insert(r);
    const std::string named = "node " + std::to_string(node) +
                              (sample->host.empty() ? "" : " (" + sample->host + ")") + ", ranks " +
                              rank_ranges(ranks) + ",";
    out.push_back(Change{true, node, ranks,
                         sample->own_seconds_per_step
                             ? named + holds(*sample, steps)
                             : named + " is " + number_text(slowest / v.median_pace, "%.1f") +
                                   "x slower than the median for the last " +
                                   std::to_string(steps) + " steps (" + pace(*sample) + ")"});
  }
  for (int rank : v.stragglers) {
    if (ranks_.count(rank) || in_slow_nodes.count(rank)) continue;
    const RankRate* r = v.find(rank);
    if (!r) continue;
    ranks_.insert(rank);
    out.push_back(Change{true,
                         std::nullopt,
                         {rank},
                         r->own_seconds_per_step
                             ? where(*r) + holds(*r, r->steps)
                             : where(*r) + " is " + number_text(v.slowdown(rank), "%.1f") +
                                   "x slower than the median for the last " +
                                   std::to_string(r->steps) + " steps (" + pace(*r) + ")"});
  }
  // Back to the pace: measured again, and clearly under the factor.
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    const int node = *it;
    std::vector<int> ranks;
    bool back = true;
    bool measured = false;
    for (const auto& r : v.ranks) {
      if (r.node != node) continue;
      ranks.push_back(r.rank);
      measured = true;
      if (r.pace() >= kBackBelow * v.factor * v.median_pace) back = false;
    }
    if (!measured || !back) {
      ++it;
      continue;
    }
    for (int r : ranks) ranks_.erase(r);
    out.push_back(Change{false, node, ranks,
                         "node " + std::to_string(node) + ", ranks " + rank_ranges(ranks) +
                             ", is back to the job's pace"});
    it = nodes_.erase(it);
  }
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    const RankRate* r = v.find(*it);
    if (!r || in_slow_nodes.count(*it) || v.slowdown(*it) >= kBackBelow * v.factor) {
      ++it;
      continue;
    }
    out.push_back(Change{false,
                         std::nullopt,
                         {*it},
                         where(*r) + " is back to the job's pace (" +
                             number_text(v.slowdown(*it), "%.1f") + "x the median)"});
    it = ranks_.erase(it);
  }
  return out;
}

}  // namespace ctrun::launcher
