#include "launcher/diagnosis/hang_report.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "launcher/cli/text.h"
#include "rendezvous/protocol/message.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A frame of a library's, not the user's: torch, the standard library, site packages.
bool library_file(const std::string& path) {
  return contains(path, "/site-packages/") || contains(path, "/dist-packages/") ||
         contains(path, "/lib/python3") || contains(path, "/torch/") ||
         starts_with(path, "<frozen ");
}

struct PyFrame {
  std::string file;
  std::string line;
  std::string function;
};

// `  File "/x/train.py", line 20 in slow_data`
std::optional<PyFrame> python_frame(const std::string& line) {
  const auto file = line.find("File \"");
  if (file == std::string::npos) return std::nullopt;
  const auto close = line.find("\", line ", file + 6);
  if (close == std::string::npos) return std::nullopt;
  const auto in = line.find(" in ", close + 8);
  PyFrame f;
  f.file = line.substr(file + 6, close - file - 6);
  f.line = line.substr(close + 8, in == std::string::npos ? std::string::npos : in - close - 8);
  f.function = in == std::string::npos ? "?" : line.substr(in + 4);
  while (!f.function.empty() && (f.function.back() == '\r' || f.function.back() == ' ')) {
    f.function.pop_back();
  }
  return f;
}

// A native frame where a thread only waits: what every rank blocked in a collective or a
// sleep shows innermost, so it says nothing of where the rank stands.
bool waiting_frame(const std::string& function) {
  static const char* const kWaits[] = {
      "poll",        "epoll_wait",
      "futex",       "pthread_cond_",
      "__GI___",     "nanosleep",
      "syscall",     "__libc_",
      "sem_wait",    "condition_variable",
      "__lll_lock",  "___pthread",
      "__read",      "recv",
      "select",      "accept",
      "__internal_", "std::this_thread",
      "sleep",       "wait",
  };
  return std::any_of(std::begin(kWaits), std::end(kWaits),
                     [&](const char* w) { return contains(function, w); });
}

// The value at `key` when it has the type asked for (the protocol's field readers).
std::string json_string(const rdzv::Json& j, const char* key) {
  auto v = rdzv::get_string(j, key);
  return v ? v.value() : std::string();
}

std::optional<std::int64_t> json_int(const rdzv::Json& j, const char* key) {
  auto v = rdzv::get_int(j, key);
  return v ? std::optional<std::int64_t>(v.value()) : std::nullopt;
}

std::string place_text(const StackPlace& p) {
  if (p.function.empty()) return "where no stack was taken";
  std::string text = "in " + p.function;
  if (!p.at.empty() || !p.from.empty()) {
    text += " (";
    text += p.at;
    if (!p.from.empty()) text += (p.at.empty() ? "from " : ", from ") + p.from;
    text += ")";
  }
  return text;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_ranges(ranks);
}

}  // namespace

std::optional<StackPlace> python_place(const std::string& text) {
  // The threads in faulthandler's order; the main thread is the oldest, listed last.
  std::vector<std::vector<PyFrame>> threads;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (contains(line, "hread 0x") && contains(line, "(most recent call first)")) {
      threads.emplace_back();
    } else if (auto f = python_frame(line)) {
      if (threads.empty()) threads.emplace_back();
      threads.back().push_back(*f);
    }
  }
  while (!threads.empty() && threads.back().empty()) threads.pop_back();
  if (threads.empty()) return std::nullopt;
  const std::vector<PyFrame>& frames = threads.back();
  StackPlace place;
  place.function = frames.front().function;
  place.at = base_name(frames.front().file) + ":" + frames.front().line;
  if (library_file(frames.front().file)) {
    for (const PyFrame& f : frames) {
      if (library_file(f.file)) continue;
      place.from = base_name(f.file) + ":" + f.line;
      break;
    }
  }
  return place;
}

StackPlace stack_place(const RankStacks& r) {
  if (auto p = python_place(r.python_stacks)) return *p;
  if (auto p = native_place(r.native_stacks)) return *p;
  return {};
}

std::optional<StackPlace> native_place(const std::string& text) {
  // `TID 1234:` then `#0  0x00007f... function` (eu-stack prints a module with -m; we do not).
  std::istringstream in(text);
  bool first_thread = false;
  std::string innermost;
  for (std::string line; std::getline(in, line);) {
    if (starts_with(line, "TID ")) {
      if (first_thread) break;
      first_thread = true;
      continue;
    }
    if (!first_thread || !starts_with(line, "#")) continue;
    std::istringstream words(line);
    std::string index, address, function;
    words >> index >> address;
    std::getline(words, function);
    function.erase(0, function.find_first_not_of(' '));
    if (const auto dash = function.find(" - "); dash != std::string::npos) function.resize(dash);
    if (function.empty()) function = address;
    if (innermost.empty()) innermost = function;
    if (!waiting_frame(function)) {
      StackPlace place;
      place.function = function.size() > 120 ? function.substr(0, 117) + "..." : function;
      return place;
    }
  }
  if (innermost.empty()) return std::nullopt;
  StackPlace place;
  place.function = innermost;
  return place;
}

rdzv::Json rank_stacks_json(const RankStacks& r) {
  rdzv::Json j{
      {"rank", r.rank}, {"node", r.node}, {"host", r.host}, {"pid", r.pid}, {"hung", r.hung}};
  j["step"] = r.step ? rdzv::Json(*r.step) : rdzv::Json(nullptr);
  if (!r.python_stacks.empty()) j["python_stacks"] = r.python_stacks;
  if (!r.native_stacks.empty()) j["native_stacks"] = r.native_stacks;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

std::optional<RankStacks> rank_stacks_from_json(const rdzv::Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto rank = json_int(j, "rank");
  if (!rank) return std::nullopt;
  RankStacks r;
  r.rank = static_cast<int>(*rank);
  r.node = static_cast<int>(json_int(j, "node").value_or(0));
  r.host = json_string(j, "host");
  r.pid = static_cast<int>(json_int(j, "pid").value_or(0));
  r.step = json_int(j, "step");
  if (auto hung = j.find("hung"); hung != j.end() && hung->is_boolean()) r.hung = *hung;
  r.python_stacks = json_string(j, "python_stacks");
  r.native_stacks = json_string(j, "native_stacks");
  r.error = json_string(j, "error");
  return r;
}

rdzv::Json flight_record_json(const FlightRecord& f) {
  rdzv::Json last = rdzv::Json::array();
  for (const auto& l : f.last) {
    last.push_back({{"group", l.group}, {"seq", l.seq}, {"op", l.op}, {"state", l.state}});
  }
  return {{"rank", f.rank}, {"last", std::move(last)}};
}

std::optional<FlightRecord> flight_record_from_json(const rdzv::Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto rank = json_int(j, "rank");
  auto last = j.find("last");
  if (!rank || last == j.end() || !last->is_array()) return std::nullopt;
  FlightRecord f;
  f.rank = static_cast<int>(*rank);
  for (const auto& l : *last) {
    if (!l.is_object()) continue;
    FlightRecord::Last entry;
    entry.group = json_string(l, "group");
    entry.seq = json_int(l, "seq").value_or(0);
    entry.op = json_string(l, "op");
    entry.state = json_string(l, "state");
    f.last.push_back(std::move(entry));
  }
  return f;
}

void DumpAnswers::add(int node, const std::string& text) {
  rdzv::Json answer = rdzv::Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) return;
  // A bad answer cannot make `ctrun status --dump` wait for a million nodes.
  if (const auto it = answer.find("nodes");
      nodes_from_node0_ && node == 0 && it != answer.end() && it->is_number_integer()) {
    nodes_ = static_cast<int>(std::clamp<std::int64_t>(it->get<std::int64_t>(), 1, 1 << 20));
  }
  answers_.insert_or_assign(node, std::move(answer));
}

JobStacks DumpAnswers::job() const {
  JobStacks job;
  for (int node = 0; node < nodes_; ++node) {
    auto it = answers_.find(node);
    if (it == answers_.end()) {
      job.missing_nodes.push_back(node);
      continue;
    }
    const rdzv::Json& answer = it->second;
    if (auto ranks = answer.find("ranks"); ranks != answer.end() && ranks->is_array()) {
      for (const auto& r : *ranks) {
        if (auto stacks = rank_stacks_from_json(r)) job.ranks.push_back(std::move(*stacks));
      }
    }
    if (auto flight = answer.find("flight"); flight != answer.end() && flight->is_array()) {
      for (const auto& f : *flight) {
        if (auto record = flight_record_from_json(f)) job.flight.push_back(std::move(*record));
      }
    }
  }
  std::sort(job.ranks.begin(), job.ranks.end(),
            [](const RankStacks& a, const RankStacks& b) { return a.rank < b.rank; });
  return job;
}

HangReport build_hang_report(const std::vector<RankStacks>& ranks, std::vector<int> missing_nodes,
                             const std::vector<FlightRecord>& flight) {
  HangReport report;
  using Key = std::tuple<std::int64_t, std::string, std::string, std::string>;
  std::map<Key, std::size_t> index;
  for (const RankStacks& r : ranks) {
    const StackPlace place = stack_place(r);
    const Key key{r.step.value_or(-1), place.function, place.at, place.from};
    auto [it, added] = index.emplace(key, report.groups.size());
    if (added) report.groups.push_back({{}, r.step, place});
    report.groups[it->second].ranks.push_back(r.rank);
  }
  for (auto& g : report.groups) std::sort(g.ranks.begin(), g.ranks.end());
  // The largest first; among equals the furthest step, then the lowest rank.
  std::sort(report.groups.begin(), report.groups.end(), [](const auto& a, const auto& b) {
    if (a.ranks.size() != b.ranks.size()) return a.ranks.size() > b.ranks.size();
    if (a.step != b.step) return a.step.value_or(-1) > b.step.value_or(-1);
    return a.ranks.front() < b.ranks.front();
  });
  if (report.groups.size() > 1) {
    const auto& main = report.groups.front();
    // Those behind the others' step first: they did not reach where the others wait.
    std::vector<int> behind, apart;
    for (std::size_t i = 1; i < report.groups.size(); ++i) {
      const auto& g = report.groups[i];
      const bool is_behind = g.step && main.step && *g.step < *main.step;
      auto& into = is_behind ? behind : apart;
      into.insert(into.end(), g.ranks.begin(), g.ranks.end());
    }
    std::sort(behind.begin(), behind.end());
    std::sort(apart.begin(), apart.end());
    report.suspects = behind.empty() ? apart : behind;
  }
  std::sort(missing_nodes.begin(), missing_nodes.end());
  report.missing_nodes = std::move(missing_nodes);
  report.flight = flight_record_lines(flight);
  return report;
}

std::vector<std::string> hang_report_lines(const HangReport& report) {
  std::vector<std::string> lines;
  std::string where;
  for (const auto& g : report.groups) {
    where += (where.empty() ? "" : "; ") + ranks_text(g.ranks);
    if (g.step) where += " at step " + std::to_string(*g.step);
    where += " " + place_text(g.place);
  }
  if (!where.empty()) lines.push_back(where);
  if (!report.suspects.empty()) {
    const auto& main = report.groups.front();
    lines.push_back(ranks_text(report.suspects) +
                    (report.suspects.size() == 1 ? " stands" : " stand") +
                    " apart: " + ranks_text(main.ranks) + " wait " + place_text(main.place) +
                    (main.step ? " at step " + std::to_string(*main.step) : ""));
  }
  if (!report.missing_nodes.empty()) {
    lines.push_back("no stacks in time from node" +
                    std::string(report.missing_nodes.size() == 1 ? " " : "s ") +
                    rank_ranges(report.missing_nodes));
  }
  lines.insert(lines.end(), report.flight.begin(), report.flight.end());
  return lines;
}

rdzv::Json hang_report_json(const HangReport& report, const std::vector<RankStacks>& ranks) {
  rdzv::Json groups = rdzv::Json::array();
  for (const auto& g : report.groups) {
    groups.push_back({{"ranks", g.ranks},
                      {"step", g.step ? rdzv::Json(*g.step) : rdzv::Json(nullptr)},
                      {"function", g.place.function},
                      {"at", g.place.at},
                      {"from", g.place.from}});
  }
  rdzv::Json all = rdzv::Json::array();
  for (const auto& r : ranks) all.push_back(rank_stacks_json(r));
  return {{"summary", hang_report_lines(report)}, {"groups", std::move(groups)},
          {"suspects", report.suspects},          {"missing_nodes", report.missing_nodes},
          {"flight_recorder", report.flight},     {"ranks", std::move(all)}};
}

std::vector<std::string> flight_record_lines(const std::vector<FlightRecord>& records) {
  // Per process group: each rank's last collective.
  std::map<std::string, std::map<int, FlightRecord::Last>> groups;
  for (const auto& f : records) {
    for (const auto& l : f.last) groups[l.group][f.rank] = l;
  }
  std::vector<std::string> lines;
  for (const auto& [group, by_rank] : groups) {
    std::int64_t newest = 0;
    std::string op;
    for (const auto& [rank, l] : by_rank) {
      if (l.seq > newest) {
        newest = l.seq;
        op = l.op;
      }
    }
    std::vector<int> entered, behind, in_it;
    std::int64_t behind_at = newest;
    for (const auto& [rank, l] : by_rank) {
      if (l.seq < newest) {
        behind.push_back(rank);
        behind_at = std::min(behind_at, l.seq);
      } else {
        entered.push_back(rank);
        if (l.state != "completed") in_it.push_back(rank);
      }
    }
    std::string line = "NCCL flight recorder: process group " + group + ": collective #" +
                       std::to_string(newest) + " (" + op + ")";
    if (behind.empty()) {
      line += in_it.empty()
                  ? " completed by every rank that dumped"
                  : " entered by every rank that dumped, not completed by " + ranks_text(in_it);
    } else {
      line += " entered by " + ranks_text(entered) + ", not by " + ranks_text(behind) + " (last #" +
              std::to_string(behind_at) + ")";
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace ctrun::launcher
