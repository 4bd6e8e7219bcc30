#include "step_verdict.h"

#include <algorithm>
#include <cmath>

#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous {

namespace {

// The value at `key` when it has the type asked for (message.h's readers), else `fallback`.
std::int64_t int_or(const Json& j, const char* key, std::int64_t fallback) {
  auto v = get_int(j, key);
  return v ? v.value() : fallback;
}

double number_or(const Json& j, const char* key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string string_or(const Json& j, const char* key) {
  auto v = get_string(j, key);
  return v ? v.value() : std::string();
}

int small_int(std::int64_t v) {
  return static_cast<int>(std::clamp<std::int64_t>(v, -(1 << 30), 1 << 30));
}

Json rank_json(const RankRate& r) {
  Json j = {{"rank", r.rank},
            {"node", r.node},
            {"host", r.host},
            {"step", r.step},
            {"seconds_per_step", r.seconds_per_step},
            {"steps", r.steps}};
  if (r.own_seconds_per_step) j["own_seconds_per_step"] = *r.own_seconds_per_step;
  if (r.wait_seconds_per_step) j["wait_seconds_per_step"] = *r.wait_seconds_per_step;
  if (!r.kind.empty()) j["kind"] = r.kind;
  if (r.cpu_seconds_per_step) j["cpu_seconds_per_step"] = *r.cpu_seconds_per_step;
  return j;
}

// A time in seconds at `key`, if there is one; an error names it when it is not a time.
Result<std::optional<double>> optional_time(const Json& j, const char* key, int rank) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0) {
    return Error{ErrorCode::kBadRequest,
                 "rank " + std::to_string(rank) + ": '" + key + "' is not a time"};
  }
  return std::optional<double>(it->get<double>());
}

Result<RankRate> rank_from_json(const Json& j) {
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer() ||
      !j.contains("seconds_per_step") || !j["seconds_per_step"].is_number()) {
    return Error{ErrorCode::kBadRequest,
                 "a step rate needs an integer 'rank' and a number 'seconds_per_step'"};
  }
  RankRate r;
  r.rank = small_int(j["rank"].get<std::int64_t>());
  r.node = small_int(int_or(j, "node", 0));
  r.host = string_or(j, "host");
  r.step = int_or(j, "step", 0);
  r.seconds_per_step = j["seconds_per_step"].get<double>();
  r.steps = int_or(j, "steps", 0);
  if (!std::isfinite(r.seconds_per_step) || r.seconds_per_step < 0) {
    return Error{ErrorCode::kBadRequest,
                 "rank " + std::to_string(r.rank) + ": 'seconds_per_step' is not a time"};
  }
  auto own = optional_time(j, "own_seconds_per_step", r.rank);
  if (!own) return own.error();
  r.own_seconds_per_step = own.value();
  auto wait = optional_time(j, "wait_seconds_per_step", r.rank);
  if (!wait) return wait.error();
  r.wait_seconds_per_step = wait.value();
  r.kind = string_or(j, "kind");
  auto cpu = optional_time(j, "cpu_seconds_per_step", r.rank);
  if (!cpu) return cpu.error();
  r.cpu_seconds_per_step = cpu.value();
  return r;
}

Result<std::vector<RankRate>> ranks_from_json(const Json& list) {
  if (!list.is_array()) return Error{ErrorCode::kBadRequest, "'ranks' is not a list"};
  std::vector<RankRate> out;
  for (const auto& item : list) {
    auto r = rank_from_json(item);
    if (!r) return r.error();
    out.push_back(std::move(r).value());
  }
  return out;
}

}  // namespace

Json node_rates_json(int node, const std::string& host, const std::vector<RankRate>& ranks) {
  Json list = Json::array();
  for (const auto& r : ranks) list.push_back(rank_json(r));
  return {{"node", node}, {"host", host}, {"ranks", std::move(list)}};
}

Result<std::vector<RankRate>> node_rates_from_json(const Json& j) {
  if (!j.is_object() || !j.contains("ranks")) {
    return Error{ErrorCode::kBadRequest, "a node's step rates need 'ranks'"};
  }
  auto ranks = ranks_from_json(j["ranks"]);
  if (!ranks) return ranks.error();
  const int node = small_int(int_or(j, "node", 0));
  const std::string host = string_or(j, "host");
  for (auto& r : ranks.value()) {
    r.node = node;
    r.host = host;
  }
  return ranks;
}

double StepVerdict::slowdown(int rank) const {
  const RankRate* r = find(rank);
  return r && median_pace > 0 ? r->pace() / median_pace : 0;
}

double StepVerdict::holds(int rank) const {
  const RankRate* r = find(rank);
  return r ? std::max(0.0, r->pace() - median_pace) : 0;
}

const RankRate* StepVerdict::find(int rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                             [](const RankRate& r, int k) { return r.rank < k; });
  return it != ranks.end() && it->rank == rank ? &*it : nullptr;
}

Json step_verdict_json(const StepVerdict& v) {
  Json list = Json::array();
  for (const auto& r : v.ranks) {
    Json j = rank_json(r);
    j["slowdown"] = v.slowdown(r.rank);
    j["holds_seconds"] = v.holds(r.rank);
    j["straggler"] = std::binary_search(v.stragglers.begin(), v.stragglers.end(), r.rank);
    list.push_back(std::move(j));
  }
  return {{"round", v.round},
          {"factor", v.factor},
          {"median_seconds_per_step", v.median},
          {"median_own_seconds_per_step", v.median_pace},
          {"stragglers", v.stragglers},
          {"straggler_nodes", v.straggler_nodes},
          {"ranks", std::move(list)}};
}

Result<StepVerdict> step_verdict_from_json(const Json& j) {
  if (!j.is_object() || !j.contains("ranks")) {
    return Error{ErrorCode::kBadRequest, "a step verdict needs 'ranks'"};
  }
  auto ranks = ranks_from_json(j["ranks"]);
  if (!ranks) return ranks.error();
  StepVerdict v;
  v.round = small_int(int_or(j, "round", 0));
  v.factor = number_or(j, "factor", 0.0);
  v.median = number_or(j, "median_seconds_per_step", 0.0);
  // A verdict of an agent before own times: its median is the pace's.
  v.median_pace = number_or(j, "median_own_seconds_per_step", v.median);
  v.ranks = std::move(ranks).value();
  std::sort(v.ranks.begin(), v.ranks.end(),
            [](const RankRate& a, const RankRate& b) { return a.rank < b.rank; });
  auto ints = [&j](const char* key) {
    std::vector<int> out;
    if (const auto it = j.find(key); it != j.end() && it->is_array()) {
      for (const auto& x : *it) {
        if (x.is_number_integer()) out.push_back(small_int(x.get<std::int64_t>()));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  v.stragglers = ints("stragglers");
  v.straggler_nodes = ints("straggler_nodes");
  return v;
}

}  // namespace ctrun::rendezvous
