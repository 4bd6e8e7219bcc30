#include "stragglers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

// A straggler is back at the job's pace below this share of the factor, so that a rank near
// the line is not named and cleared at every verdict.
constexpr double kBackBelow = 0.9;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "12-15" for consecutive ranks, else "3,7,9".
std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "";
  const bool consecutive = ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size());
  if (consecutive && ranks.size() > 2) {
    return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  }
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

rdzv::Json rank_json(const RankRate& r) {
  return {{"rank", r.rank},
          {"node", r.node},
          {"host", r.host},
          {"step", r.step},
          {"seconds_per_step", r.seconds_per_step},
          {"steps", r.steps}};
}

rdzv::Result<RankRate> rank_from_json(const rdzv::Json& j) {
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer() ||
      !j.contains("seconds_per_step") || !j["seconds_per_step"].is_number()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "a step rate needs an integer 'rank' and a number 'seconds_per_step'"};
  }
  RankRate r;
  r.rank = j["rank"].get<int>();
  r.node = j.value("node", 0);
  r.host = j.value("host", std::string());
  r.step = j.value("step", std::int64_t{0});
  r.seconds_per_step = j["seconds_per_step"].get<double>();
  r.steps = j.value("steps", std::int64_t{0});
  if (!std::isfinite(r.seconds_per_step) || r.seconds_per_step < 0) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "rank " + std::to_string(r.rank) + ": 'seconds_per_step' is not a time"};
  }
  return r;
}

rdzv::Result<std::vector<RankRate>> ranks_from_json(const rdzv::Json& list) {
  if (!list.is_array()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest, "'ranks' is not a list"};
  }
  std::vector<RankRate> out;
  for (const auto& item : list) {
    auto r = rank_from_json(item);
    if (!r) return r.error();
    out.push_back(std::move(r).value());
  }
  return out;
}

void sort_by_rank(std::vector<RankRate>& ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankRate& a, const RankRate& b) { return a.rank < b.rank; });
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string where(const RankRate& r) {
  return "rank " + std::to_string(r.rank) + (r.host.empty() ? "" : " on " + r.host);
}

}  // namespace

rdzv::Json node_rates_json(int node, const std::string& host, const std::vector<RankRate>& ranks) {
  rdzv::Json list = rdzv::Json::array();
  for (const auto& r : ranks) list.push_back(rank_json(r));
  return {{"node", node}, {"host", host}, {"ranks", std::move(list)}};
}

rdzv::Result<std::vector<RankRate>> node_rates_from_json(const rdzv::Json& j) {
  if (!j.is_object() || !j.contains("ranks")) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest, "a node's step rates need 'ranks'"};
  }
  auto ranks = ranks_from_json(j["ranks"]);
  if (!ranks) return ranks.error();
  const int node = j.value("node", 0);
  const std::string host = j.value("host", std::string());
  for (auto& r : ranks.value()) {
    r.node = node;
    r.host = host;
  }
  return ranks;
}

double StepVerdict::slowdown(int rank) const {
  const RankRate* r = find(rank);
  return r && median > 0 ? r->seconds_per_step / median : 0;
}

const RankRate* StepVerdict::find(int rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                             [](const RankRate& r, int k) { return r.rank < k; });
  return it != ranks.end() && it->rank == rank ? &*it : nullptr;
}

StepVerdict judge_steps(std::vector<RankRate> ranks, double factor, int round) {
  StepVerdict v;
  v.round = round;
  v.factor = factor;
  sort_by_rank(ranks);
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

rdzv::Json step_verdict_json(const StepVerdict& v) {
  rdzv::Json list = rdzv::Json::array();
  for (const auto& r : v.ranks) {
    rdzv::Json j = rank_json(r);
    j["slowdown"] = v.slowdown(r.rank);
    j["straggler"] = std::binary_search(v.stragglers.begin(), v.stragglers.end(), r.rank);
    list.push_back(std::move(j));
  }
  return {{"round", v.round},
          {"factor", v.factor},
          {"median_seconds_per_step", v.median},
          {"stragglers", v.stragglers},
          {"straggler_nodes", v.straggler_nodes},
          {"ranks", std::move(list)}};
}

rdzv::Result<StepVerdict> step_verdict_from_json(const rdzv::Json& j) {
  if (!j.is_object() || !j.contains("ranks")) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest, "a step verdict needs 'ranks'"};
  }
  auto ranks = ranks_from_json(j["ranks"]);
  if (!ranks) return ranks.error();
  StepVerdict v;
  v.round = j.value("round", 0);
  v.factor = j.value("factor", 0.0);
  v.median = j.value("median_seconds_per_step", 0.0);
  v.ranks = std::move(ranks).value();
  sort_by_rank(v.ranks);
  auto ints = [&j](const char* key) {
    std::vector<int> out;
    if (j.contains(key) && j[key].is_array()) {
      for (const auto& x : j[key]) {
        if (x.is_number_integer()) out.push_back(x.get<int>());
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  v.stragglers = ints("stragglers");
  v.straggler_nodes = ints("straggler_nodes");
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
    return fixed(r.seconds_per_step, 3) + " s/step against the median's " + fixed(v.median, 3) +
           " s";
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
    out.push_back(Change{true, node, ranks,
                         "node " + std::to_string(node) +
                             (sample->host.empty() ? "" : " (" + sample->host + ")") + ", ranks " +
                             rank_list(ranks) + ", is " + fixed(slowest / v.median, 1) +
                             "x slower than the median for the last " + std::to_string(steps) +
                             " steps (" + pace(*sample) + ")"});
  }
  for (int rank : v.stragglers) {
    if (ranks_.count(rank) || in_slow_nodes.count(rank)) continue;
    const RankRate* r = v.find(rank);
    if (!r) continue;
    ranks_.insert(rank);
    out.push_back(Change{true,
                         std::nullopt,
                         {rank},
                         where(*r) + " is " + fixed(v.slowdown(rank), 1) +
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
                         "node " + std::to_string(node) + ", ranks " + rank_list(ranks) +
                             ", is back to the job's pace"});
    it = nodes_.erase(it);
  }
  for (auto it = ranks_.begin(); it != ranks_.end();) {
    const RankRate* r = v.find(*it);
    if (!r || in_slow_nodes.count(*it) || v.slowdown(*it) >= kBackBelow * v.factor) {
      ++it;
      continue;
    }
    out.push_back(Change{
        false,
        std::nullopt,
        {*it},
        where(*r) + " is back to the job's pace (" + fixed(v.slowdown(*it), 1) + "x the median)"});
    it = ranks_.erase(it);
  }
  return out;
}

}  // namespace ctrun::launcher
