#include "launcher/diagnosis/stragglers.h"
#include "launcher/cli/text.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

// A straggler is back at the job's pace below this share of the factor, so that a rank near
// the line is not named and cleared at every verdict.
constexpr double kBackBelow = 0.9;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

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
  std::vector<double> times;
  for (const auto& r : v.ranks) times.push_back(r.seconds_per_step);
  v.median = median_of(std::move(times));
  if (v.median <= 0 || factor <= 0) return v;
  std::map<int, std::pair<int, int>> per_node;  // node -> (ranks, stragglers)
  for (const auto& r : v.ranks) {
    const bool slow = r.seconds_per_step >= factor * v.median;
    if (slow) v.stragglers.push_back(r.rank);
    auto& [all, slow_ones] = per_node[r.node];
    ++all;
    slow_ones += slow ? 1 : 0;
  }
  for (const auto& [node, counts] : per_node) {
    if (counts.first > 1 && counts.first == counts.second) v.straggler_nodes.push_back(node);
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
      if (!sample || r.seconds_per_step > slowest) {
        sample = &r;
        slowest = r.seconds_per_step;
      }
      steps = std::max(steps, r.steps);
    }
    if (nodes_.count(node) || !sample) continue;
    nodes_.insert(node);
    for (int r : ranks) ranks_.insert(r);
    out.push_back(Change{
        true, node, ranks,
        "node " + std::to_string(node) + (sample->host.empty() ? "" : " (" + sample->host + ")") +
            ", ranks " + rank_ranges(ranks) + ", is " + number_text(slowest / v.median, "%.1f") +
            "x slower than the median for the last " + std::to_string(steps) + " steps (" +
            pace(*sample) + ")"});
  }
  for (int rank : v.stragglers) {
    if (ranks_.count(rank) || in_slow_nodes.count(rank)) continue;
    const RankRate* r = v.find(rank);
    if (!r) continue;
    ranks_.insert(rank);
    out.push_back(Change{true,
                         std::nullopt,
                         {rank},
                         where(*r) + " is " + number_text(v.slowdown(rank), "%.1f") +
                             "x slower than the median for the last " + std::to_string(r->steps) +
                             " steps (" + pace(*r) + ")"});
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
      if (r.seconds_per_step >= kBackBelow * v.factor * v.median) back = false;
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
