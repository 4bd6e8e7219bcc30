#include "launcher/faults/fault_plan.h"

#include <cmath>
#include <csignal>

#include "ctrun/launcher/options.h"
#include "launcher/cli/option_text.h"
#include "launcher/cli/text.h"

namespace ctrun::launcher {
namespace {

using rendezvous::Json;
using rendezvous::Result;

// splitmix64: a fixed generator, so that one seed gives one plan with any compiler and
// standard library (std::uniform_*_distribution is not specified bit for bit).
class SeededDraws {
 public:
  explicit SeededDraws(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi], rounded to milliseconds (the plan prints them exactly).
  double seconds(double lo, double hi) {
    const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return std::round((lo + (hi - lo) * u) * 1000.0) / 1000.0;
  }
  int integer(int lo, int hi) {  // uniform in [lo, hi]
    return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }

 private:
  std::uint64_t state_;
};

// Every kind a fault may be, by name: the signals, then the others, in the order the errors list
// them. One table for reading a plan and writing it back.
struct KindName {
  const char* name;
  FaultKind kind;
  int signo;  // kSignal's
};
constexpr KindName kKinds[] = {
    {"kill", FaultKind::kSignal, SIGKILL},
    {"term", FaultKind::kSignal, SIGTERM},
    {"int", FaultKind::kSignal, SIGINT},
    {"segv", FaultKind::kSignal, SIGSEGV},
    {"abrt", FaultKind::kSignal, SIGABRT},
    {"hang", FaultKind::kHang, 0},
    {"straggler", FaultKind::kStraggler, 0},
    {"node_lost", FaultKind::kNodeLost, 0},
    {"exception", FaultKind::kException, 0},
    {"cuda_error", FaultKind::kCudaError, 0},
    {"store_latency", FaultKind::kStoreLatency, 0},
    {"cut_off", FaultKind::kCutOff, 0},
    {"link_lost", FaultKind::kLinkLost, 0},
    {"disk_full", FaultKind::kDiskFull, 0},
    {"rendezvous_restart", FaultKind::kRendezvousRestart, 0},
};

const KindName* find_kind(const std::string& name) {
  for (const auto& k : kKinds) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// "kill, term, ...": every kind, for the errors that list them.
std::string kind_list() {
  std::string out;
  for (const auto& k : kKinds) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

// What a random plan may draw: faults of a worker or its node, at a rank.
constexpr const char* kRandomKindList =
    "kill, term, int, segv, abrt, hang, straggler, node_lost, exception, cuda_error, cut_off";

bool random_kind(const std::string& name) {
  const KindName* k = find_kind(name);
  return k && (k->kind == FaultKind::kSignal || k->kind == FaultKind::kHang ||
               k->kind == FaultKind::kStraggler || k->kind == FaultKind::kNodeLost ||
               k->kind == FaultKind::kException || k->kind == FaultKind::kCudaError ||
               k->kind == FaultKind::kCutOff);
}

// The kinds that last `duration` seconds.
bool lasting(FaultKind kind) {
  return kind == FaultKind::kHang || kind == FaultKind::kStraggler ||
         kind == FaultKind::kStoreLatency || kind == FaultKind::kCutOff ||
         kind == FaultKind::kLinkLost || kind == FaultKind::kDiskFull ||
         kind == FaultKind::kRendezvousRestart;
}

std::string kind_name(const Fault& f) {
  for (const auto& k : kKinds) {
    if (k.kind == f.kind && (f.kind != FaultKind::kSignal || k.signo == f.signo)) return k.name;
  }
  return "abrt";  // a signal no plan names (plans are read through kKinds)
}

// One fault's fields, from JSON or inline text alike (every value as JSON).
Result<Fault> make_fault(int id, const std::string& kind, const Json& fields, std::uint64_t seed) {
  const std::string where = "--faults: fault " + std::to_string(id) + ": ";
  Fault f;
  f.id = id;
  const KindName* named = find_kind(kind);
  if (!named) return bad(where + "unknown kind '" + kind + "' (" + kind_list() + ")");
  f.kind = named->kind;
  f.signo = named->signo;
  bool timed = false;
  for (const auto& [key, value] : fields.items()) {
    auto number = [&]() -> Result<double> {
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
        return bad(where + key + ": expected a non-negative number, got " + value.dump());
      }
      return value.get<double>();
    };
    auto index = [&]() -> Result<int> {
      if (!value.is_number_integer() || value.get<long long>() < 0 ||
          value.get<long long>() >= (1 << 24)) {
        return bad(where + key + ": expected a rank or node number, got " + value.dump());
      }
      return static_cast<int>(value.get<long long>());
    };
    if (key == "kind") continue;
    if (key == "rank" || key == "node" || key == "local_rank" || key == "peer") {
      auto n = index();
      if (!n) return n.error();
      (key == "rank"   ? f.rank
       : key == "node" ? f.node
       : key == "peer" ? f.peer
                       : f.local_rank) = n.value();
    } else if (key == "path") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return bad(where + "path: expected a directory, got " + value.dump());
      }
      f.path = value.get<std::string>();
    } else if (key == "after") {
      auto n = number();
      if (!n) return n.error();
      f.after = n.value();
      timed = true;
    } else if (key == "at_step") {
      if (!value.is_number_integer() || value.get<long long>() < 1) {
        return bad(where + "at_step: expected a step number (1 or more), got " + value.dump());
      }
      f.at_step = value.get<long long>();
      timed = true;
    } else if (key == "window") {
      if (!value.is_array() || value.size() != 2 || !value[0].is_number() ||
          !value[1].is_number() || value[0].get<double>() < 0 ||
          value[1].get<double>() < value[0].get<double>()) {
        return bad(where + "window: expected [FROM, TO] seconds with FROM <= TO, got " +
                   value.dump());
      }
      // Each fault its own draw, the same on every agent.
      SeededDraws draws(seed ^ (0x5eedULL * static_cast<std::uint64_t>(id)));
      f.after = draws.seconds(value[0].get<double>(), value[1].get<double>());
      timed = true;
    } else if (key == "duration") {
      auto n = number();
      if (!n) return n.error();
      f.duration = n.value();
    } else if (key == "speed") {
      auto n = number();
      if (!n) return n.error();
      if (n.value() <= 0 || n.value() >= 1) {
        return bad(where + "speed: expected a share of time between 0 and 1, got " + value.dump());
      }
      f.speed = n.value();
    } else if (key == "ms") {
      auto n = number();
      if (!n) return n.error();
      if (n.value() <= 0 || n.value() > 600000) {
        return bad(where + "ms: expected milliseconds above 0 (up to 600000), got " + value.dump());
      }
      f.ms = n.value();
    } else {
      return bad(where + "unknown field '" + key +
                 "' (rank, node, local_rank, peer, after, window, at_step, duration, speed, ms, "
                 "path)");
    }
  }
  if (!timed) {
    return bad(where + "says not when: give after=SECONDS, window=FROM-TO or at_step=N");
  }
  if (f.at_step && (fields.contains("after") || fields.contains("window"))) {
    return bad(where + "give a time (after, window) or a step (at_step), not both");
  }
  if (f.rank && (f.node || f.local_rank)) {
    return bad(where + "give rank, or node and local_rank, not both");
  }
  if (f.kind == FaultKind::kStoreLatency) {
    // The daemon's: no worker, no step of one.
    if (f.rank || f.node || f.local_rank) {
      return bad(where + "store latency is the rendezvous daemon's: no rank or node");
    }
    if (f.at_step) return bad(where + "store latency is timed: give after=SECONDS or window");
    if (f.ms <= 0) return bad(where + "store latency needs ms=MILLISECONDS");
    if (!(f.duration > 0)) return bad(where + "store latency needs duration=SECONDS");
  } else if (f.kind == FaultKind::kRendezvousRestart) {
    if (f.rank || f.node || f.local_rank) {
      return bad(where + "the rendezvous is ctrun's, not a node's: no rank or node");
    }
    if (f.at_step)
      return bad(where + "a rendezvous restart is timed: give after=SECONDS or window");
  } else if (f.kind == FaultKind::kLinkLost) {
    if (!f.node || !f.peer || f.rank || f.local_rank) {
      return bad(where + "a lost link is between node=N and peer=M (group ranks)");
    }
    if (*f.node == *f.peer) return bad(where + "a link's two ends are two nodes: node = peer");
  } else if (node_fault(f.kind)) {
    if (f.local_rank) {
      return bad(where + "the fault is a whole node's: give node=N (or the node of a rank=N)");
    }
    if (!f.rank && !f.node) return bad(where + "says not where: give node=N or rank=N");
  } else if (!f.rank && !(f.node && f.local_rank)) {
    return bad(where + "says not where: give rank=N, or node=N and local_rank=N");
  }
  if ((f.kind == FaultKind::kStraggler || f.kind == FaultKind::kCutOff ||
       f.kind == FaultKind::kLinkLost || f.kind == FaultKind::kDiskFull) &&
      f.duration <= 0) {
    return bad(where + kind + " needs duration=SECONDS");
  }
  if (!lasting(f.kind) && fields.contains("duration")) {
    return bad(where + kind + " has no duration");
  }
  if (f.kind != FaultKind::kLinkLost && fields.contains("peer")) {
    return bad(where + "peer is a lost link's");
  }
  if (f.kind == FaultKind::kDiskFull && f.path.empty()) {
    return bad(where + "disk_full needs path=DIRECTORY (the checkpoint directory)");
  }
  if (f.kind != FaultKind::kDiskFull && fields.contains("path")) {
    return bad(where + "path is disk_full's");
  }
  if (f.kind != FaultKind::kStoreLatency && fields.contains("ms")) {
    return bad(where + "ms is store latency's");
  }
  if (f.kind != FaultKind::kStraggler && fields.contains("speed")) {
    return bad(where + "speed is a straggler's");
  }
  return f;
}

// "10-40" as [10, 40].
std::optional<std::pair<double, double>> range(const std::string& text) {
  const auto dash = text.find('-', 1);
  if (dash == std::string::npos) return std::nullopt;
  try {
    std::size_t used = 0;
    const double lo = std::stod(text.substr(0, dash), &used);
    if (used != dash) return std::nullopt;
    const std::string rest = text.substr(dash + 1);
    const double hi = std::stod(rest, &used);
    if (used != rest.size() || lo < 0 || hi < lo) return std::nullopt;
    return std::pair{lo, hi};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "0-7" as [0, 7], "3" as [3, 3].
std::optional<std::pair<int, int>> rank_range(const std::string& text) {
  const auto dash = text.find('-');
  auto lo = to_int(text.substr(0, dash));
  auto hi = dash == std::string::npos ? lo : to_int(text.substr(dash + 1));
  if (!lo || !hi || *lo < 0 || *hi < *lo || *hi >= (1 << 24)) return std::nullopt;
  return std::pair<int, int>(static_cast<int>(*lo), static_cast<int>(*hi));
}

std::string seconds_text(double s) { return number_text(s, "%.3f"); }

}  // namespace

bool node_fault(FaultKind kind) {
  return kind == FaultKind::kNodeLost || kind == FaultKind::kCutOff ||
         kind == FaultKind::kLinkLost || kind == FaultKind::kDiskFull;
}

Result<FaultPlan> parse_fault_plan_json(const std::string& text, const std::string& source) {
  const Json doc = Json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return bad("--faults: " + source + ": not a JSON object {\"faults\": [...]}");
  }
  FaultPlan plan;
  for (const auto& [key, value] : doc.items()) {
    if (key == "seed") {
      if (!value.is_number_unsigned()) {
        return bad("--faults: " + source + ": seed: expected a non-negative integer");
      }
      plan.seed = value.get<std::uint64_t>();
    } else if (key != "faults") {
      return bad("--faults: " + source + ": unknown field '" + key + "' (seed, faults)");
    }
  }
  if (!doc.contains("faults") || !doc["faults"].is_array()) {
    return bad("--faults: " + source + ": expected a list \"faults\"");
  }
  int id = 0;
  for (const Json& entry : doc["faults"]) {
    ++id;
    if (!entry.is_object() || !entry.contains("kind") || !entry["kind"].is_string()) {
      return bad("--faults: fault " + std::to_string(id) + ": expected an object with a \"kind\"");
    }
    auto f = make_fault(id, entry["kind"].get<std::string>(), entry, plan.seed);
    if (!f) return f.error();
    plan.faults.push_back(std::move(f).value());
  }
  return plan;
}

Result<FaultPlan> parse_inline_fault_plan(const std::string& text) {
  FaultPlan plan;
  int id = 0;
  for (const auto& item : split(text, ';')) {
    if (item.empty()) continue;
    ++id;
    const auto colon = item.find(':');
    const std::string kind = item.substr(0, colon);
    Json fields = Json::object();
    if (colon != std::string::npos) {
      for (const auto& pair : split(item.substr(colon + 1), ',')) {
        const auto eq = pair.find('=');
        if (eq == std::string::npos) {
          return bad("--faults: fault " + std::to_string(id) + ": expected KEY=VALUE, got '" +
                     pair + "'");
        }
        const std::string key = pair.substr(0, eq);
        const std::string value = pair.substr(eq + 1);
        if (key == "window") {
          auto r = range(value);
          if (!r) {
            return bad("--faults: fault " + std::to_string(id) +
                       ": window: expected FROM-TO seconds, got '" + value + "'");
          }
          fields[key] = Json::array({r->first, r->second});
          continue;
        }
        if (key == "path") {
          fields[key] = value;
          continue;
        }
        if (key == "rank" || key == "node" || key == "local_rank" || key == "peer" ||
            key == "at_step") {
          auto n = to_int(value);
          fields[key] = n ? Json(*n) : Json(value);
          continue;
        }
        try {
          std::size_t used = 0;
          const double v = std::stod(value, &used);
          fields[key] = used == value.size() ? Json(v) : Json(value);
        } catch (const std::exception&) {
          fields[key] = value;
        }
      }
    }
    auto f = make_fault(id, kind, fields, plan.seed);
    if (!f) return f.error();
    plan.faults.push_back(std::move(f).value());
  }
  if (plan.faults.empty()) return bad("--faults: no fault in '" + text + "'");
  return plan;
}

Result<FaultPlan> random_fault_plan(const std::string& spec) {
  const std::string body = spec.substr(spec.find(':') + 1);
  std::optional<std::uint64_t> seed;
  int count = 5;
  std::vector<std::string> kinds = {"kill", "hang", "straggler"};
  std::optional<std::pair<int, int>> ranks, steps;
  std::optional<std::pair<double, double>> window;
  double duration = 10;
  for (const auto& pair : split(body, ',')) {
    const auto eq = pair.find('=');
    const std::string key = pair.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : pair.substr(eq + 1);
    auto fail = [&](const std::string& expected) {
      return bad("--faults=random: " + key + ": expected " + expected + ", got '" + value + "'");
    };
    if (key == "seed") {
      auto n = to_int(value);
      if (!n || *n < 0) return fail("a non-negative integer");
      seed = static_cast<std::uint64_t>(*n);
    } else if (key == "count") {
      auto n = to_int(value);
      if (!n || *n < 1 || *n > 1000) return fail("1..1000");
      count = static_cast<int>(*n);
    } else if (key == "kinds") {
      kinds = split(value, '+');
      for (const auto& k : kinds) {
        if (!random_kind(k)) {
          return fail(std::string("kinds joined by + (") + kRandomKindList + ")");
        }
      }
      if (kinds.empty()) return fail("kinds joined by +");
    } else if (key == "ranks") {
      ranks = rank_range(value);
      if (!ranks) return fail("FIRST-LAST ranks");
    } else if (key == "window") {
      window = range(value);
      if (!window) return fail("FROM-TO seconds");
    } else if (key == "steps") {
      steps = rank_range(value);
      if (!steps || steps->first < 1) return fail("FIRST-LAST steps (from 1)");
    } else if (key == "duration") {
      try {
        duration = std::stod(value);
      } catch (const std::exception&) {
        return fail("seconds");
      }
      if (!(duration > 0)) return fail("seconds");
    } else {
      return bad("--faults=random: unknown setting '" + key +
                 "' (seed, count, kinds, ranks, window, steps, duration)");
    }
  }
  if (!seed) return bad("--faults=random: give seed=N: the seed makes the plan");
  if (!ranks) return bad("--faults=random: give ranks=FIRST-LAST: the ranks faults may hit");
  if (!window == !steps) {
    return bad(
        "--faults=random: give window=FROM-TO (the seconds faults fall in) or "
        "steps=FIRST-LAST (the steps), one of them");
  }
  FaultPlan plan;
  plan.seed = *seed;
  SeededDraws draws(*seed);
  for (int id = 1; id <= count; ++id) {
    Json fields = Json::object();
    fields["rank"] = draws.integer(ranks->first, ranks->second);
    if (window) {
      fields["after"] = draws.seconds(window->first, window->second);
    } else {
      fields["at_step"] = draws.integer(steps->first, steps->second);
    }
    const std::string kind =
        kinds[static_cast<std::size_t>(draws.integer(0, static_cast<int>(kinds.size()) - 1))];
    if (kind == "hang" || kind == "straggler" || kind == "cut_off") fields["duration"] = duration;
    auto f = make_fault(id, kind, fields, plan.seed);
    if (!f) return f.error();
    plan.faults.push_back(std::move(f).value());
  }
  return plan;
}

Result<Json> parse_fault_request(const std::string& text) {
  if (text.find(';') != std::string::npos) {
    return bad("ctrun fault: one fault at a time, got '" + text + "'");
  }
  std::string fault = text;
  const bool timed = text.find("after=") != std::string::npos ||
                     text.find("window=") != std::string::npos ||
                     text.find("at_step=") != std::string::npos;
  if (!timed) fault += text.find(':') == std::string::npos ? ":after=0" : ",after=0";
  auto plan = parse_inline_fault_plan(fault);
  if (!plan) {
    std::string message = plan.error().message;
    const std::string planned = "--faults: fault 1: ";
    if (message.rfind(planned, 0) == 0) message = "ctrun fault: " + message.substr(planned.size());
    return bad(message);
  }
  if (plan.value().faults.size() != 1) {
    return bad("ctrun fault: expected one fault, got '" + text + "'");
  }
  return fault_plan_json(plan.value())["faults"][0];
}

Json fault_plan_json(const FaultPlan& plan) {
  Json faults = Json::array();
  for (const Fault& f : plan.faults) {
    Json j = {{"kind", kind_name(f)}};
    if (f.rank) j["rank"] = *f.rank;
    if (f.node) j["node"] = *f.node;
    if (f.local_rank) j["local_rank"] = *f.local_rank;
    if (f.at_step) {
      j["at_step"] = *f.at_step;
    } else {
      j["after"] = f.after;
    }
    if (f.peer) j["peer"] = *f.peer;
    if (lasting(f.kind)) j["duration"] = f.duration;
    if (!f.path.empty()) j["path"] = f.path;
    if (f.kind == FaultKind::kStoreLatency) j["ms"] = f.ms;
    if (f.kind == FaultKind::kStraggler) j["speed"] = f.speed;
    faults.push_back(std::move(j));
  }
  return Json{{"seed", plan.seed}, {"faults", std::move(faults)}};
}

std::string describe_fault(const Fault& f) {
  std::string where = "node " + std::to_string(f.node.value_or(0));
  if (f.rank) {
    where = "rank " + std::to_string(*f.rank);
  } else if (f.local_rank) {
    where += " local rank " + std::to_string(*f.local_rank);
  }
  std::string what;
  switch (f.kind) {
    case FaultKind::kSignal:
      what = signal_name(f.signo) + " to " + where;
      break;
    case FaultKind::kHang:
      what =
          where + " hung (SIGSTOP" +
          (f.duration > 0 ? ", resumed after " + seconds_text(f.duration) + " s)" : ", for good)");
      break;
    case FaultKind::kNodeLost:
      what = (f.rank ? "the node of " + where : where) + " lost (its agent and workers killed)";
      break;
    case FaultKind::kCutOff:
      what = (f.rank ? "the node of " + where : where) + " cut off from the rendezvous for " +
             seconds_text(f.duration) + " s";
      break;
    case FaultKind::kLinkLost:
      what = "the link between " + where + " and node " + std::to_string(f.peer.value_or(0)) +
             " lost for " + seconds_text(f.duration) + " s";
      break;
    case FaultKind::kDiskFull:
      what = "the disk of '" + f.path + "' on " + (f.rank ? "the node of " + where : where) +
             " full for " + seconds_text(f.duration) + " s";
      break;
    case FaultKind::kRendezvousRestart:
      what = "the rendezvous killed, restarted after " + seconds_text(f.duration) + " s";
      break;
    case FaultKind::kException:
      what = "an exception raised in " + where;
      break;
    case FaultKind::kCudaError:
      what = "a CUDA error in " + where;
      break;
    case FaultKind::kStoreLatency:
      what = "the rendezvous answering " + std::to_string(std::lround(f.ms)) + " ms late for " +
             seconds_text(f.duration) + " s";
      break;
    case FaultKind::kStraggler:
      what = where + " slowed to " + std::to_string(static_cast<int>(std::lround(f.speed * 100))) +
             " % for " + seconds_text(f.duration) + " s";
      break;
  }
  return "fault " + std::to_string(f.id) + ": " + what + " at " +
         (f.at_step ? "step " + std::to_string(*f.at_step) : seconds_text(f.after) + " s");
}

}  // namespace ctrun::launcher
