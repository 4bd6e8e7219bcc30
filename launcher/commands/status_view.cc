#include "launcher/commands/status_view.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "launcher/cli/text.h"
#include "launcher/diagnosis/stragglers.h"

namespace ctrun::launcher {

using rendezvous::Json;

namespace {

// Columns padded to their widest cell, two spaces apart.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);  // an empty last cell leaves no blanks
    out += line + "\n";
  }
  return out;
}

// Each rank's step time against the job's median, the stragglers marked; past kStepRowsShown
// ranks only the stragglers.
std::string step_table(const Json& steps) {
  const Json& ranks = steps["ranks"];
  std::string out = "step times (round " + std::to_string(steps.value("round", 0)) + ", median " +
                    number_text(steps.value("median_seconds_per_step", 0.0), "%.3f") +
                    " s/step, a straggler at " + number_text(steps.value("factor", 0.0), "%g") +
                    "x): " + std::to_string(steps["stragglers"].size()) + " straggler" +
                    (steps["stragglers"].size() == 1 ? "" : "s") + "\n";
  // Where the ranks measure their waits for each other (a synchronous job), their own time per
  // step, how long each holds the others' steps and on what: the step times alone are equal.
  bool own = false;
  for (const auto& r : ranks) own = own || r.contains("own_seconds_per_step");
  std::vector<std::vector<std::string>> rows{
      {"RANK", "GROUP_RANK", "HOST", "STEP", "S_PER_STEP", "X_MEDIAN", ""}};
  if (own) {
    rows[0] = {"RANK",  "GROUP_RANK", "HOST",     "STEP", "S_PER_STEP",
               "OWN_S", "HOLDS_S",    "X_MEDIAN", "KIND", ""};
  }
  const bool all = ranks.size() <= kStepRowsShown;
  std::size_t left_out = 0;
  for (const auto& r : ranks) {
    const bool straggler = r.value("straggler", false);
    if (!all && !straggler) {
      ++left_out;
      continue;
    }
    std::vector<std::string> row{std::to_string(r.value("rank", 0)),
                                 std::to_string(r.value("node", 0)), r.value("host", std::string()),
                                 std::to_string(r.value("step", 0LL)),
                                 number_text(r.value("seconds_per_step", 0.0), "%.3f")};
    if (own) {
      const auto own_time = r.find("own_seconds_per_step");
      row.push_back(own_time != r.end() && own_time->is_number()
                        ? number_text(own_time->get<double>(), "%.3f")
                        : "-");
      row.push_back(number_text(r.value("holds_seconds", 0.0), "%.3f"));
    }
    row.push_back(number_text(r.value("slowdown", 0.0), "%.2f"));
    if (own) row.push_back(r.value("kind", std::string("-")));
    row.push_back(straggler ? "straggler" : "");
    rows.push_back(std::move(row));
  }
  out += table(rows);
  if (left_out > 0) {
    out += "(" + std::to_string(left_out) + " more ranks at the job's pace: --json lists them)\n";
  }
  return out;
}

std::string seconds_text(double s) { return number_text(s, "%.1f") + " s"; }

}  // namespace

Json job_status_json(const JobStatus& job) {
  const Json& st = job.status;
  const Json rdzv = st.value("rendezvous", Json());
  const long long used = st.value("restarts", 0LL);
  Json out{{"job", st.value("job", "")},
           {"state", rdzv.is_object() ? rdzv.value("state", "") : "store"},
           {"round", rdzv.is_object() ? rdzv.value("round", 0) : 0},
           {"formed", rdzv.is_object() && rdzv.value("formed", false)},
           {"min_nodes", rdzv.is_object() ? rdzv.value("min_nodes", 0) : 0},
           {"max_nodes", rdzv.is_object() ? rdzv.value("max_nodes", 0) : 0},
           {"restarts", used},
           {"max_restarts", job.max_restarts >= 0 ? Json(job.max_restarts) : Json()},
           {"restarts_left",
            job.max_restarts >= 0 ? Json(std::max(0LL, job.max_restarts - used)) : Json()},
           {"faults_injected", st.value("faults_injected", 0LL)},
           {"last_fault", job.last_fault},
           {"connections", st.value("connections", 0)},
           {"keys", st.value("keys", 0)},
           {"end_reason", rdzv.is_object() ? rdzv.value("end_reason", "") : ""}};
  Json nodes = Json::array();
  if (rdzv.is_object() && rdzv.contains("nodes") && rdzv["nodes"].is_array()) {
    for (const auto& n : rdzv["nodes"]) {
      nodes.push_back(
          {{"node", n.value("node", "")},
           {"host", n.value("host", "")},
           {"group_rank", n.value("group_rank", -1)},
           {"local_world_size", n.value("local_world_size", 0)},
           {"place", n.value("place", "")},
           {"succeeded", n.value("succeeded", false)},
           // null: no heartbeat to be had (etcd: the node's lease is gone)
           {"last_heartbeat_age_s", n.value("last_seen_ms_ago", 0) < 0
                                        ? Json()
                                        : Json(n.value("last_seen_ms_ago", 0) / 1000.0)}});
    }
    // Members by group rank first, then the others by node id.
    std::stable_sort(nodes.begin(), nodes.end(), [](const Json& a, const Json& b) {
      const int ra = a["group_rank"], rb = b["group_rank"];
      if ((ra < 0) != (rb < 0)) return ra >= 0;
      return ra < rb;
    });
  }
  out["nodes"] = std::move(nodes);
  out["steps"] = Json();
  if (!job.steps.is_null()) {
    if (auto verdict = step_verdict_from_json(job.steps)) {
      out["steps"] = step_verdict_json(verdict.value());
    }
  }
  return out;
}

std::string job_status_table(const JobStatus& job) {
  const Json j = job_status_json(job);
  std::string restarts = std::to_string(j["restarts"].get<long long>());
  if (!j["max_restarts"].is_null()) {
    restarts += " of " + std::to_string(j["max_restarts"].get<long long>()) + " (" +
                std::to_string(j["restarts_left"].get<long long>()) + " left)";
  }
  std::string out = "job " + j["job"].get<std::string>() + ": " + j["state"].get<std::string>();
  if (j["state"] != "store") {
    out += ", round " + std::to_string(j["round"].get<int>()) +
           (j["formed"].get<bool>() ? " (formed)" : " (gathering)") + ", nodes " +
           std::to_string(j["nodes"].size()) + " (min " +
           std::to_string(j["min_nodes"].get<int>()) + ", max " +
           std::to_string(j["max_nodes"].get<int>()) + ")";
  }
  out += ", restarts " + restarts + "\n";
  if (!j["end_reason"].get<std::string>().empty()) {
    out += "ended: " + j["end_reason"].get<std::string>() + "\n";
  }
  // Injected on purpose (ctrun --faults, ctrun fault): said apart from real failures.
  if (const long long faults = j["faults_injected"].get<long long>(); faults > 0) {
    out += "faults injected on purpose: " + std::to_string(faults);
    const Json& last = j["last_fault"];
    if (last.is_object()) {
      out += "; last: " + last.value("what", std::string()) + " (" +
             last.value("time", std::string()) + ", node " + last.value("node", std::string()) +
             ")";
    }
    out += "\n";
  }
  if (j["nodes"].empty()) return out;
  std::vector<std::vector<std::string>> rows{
      {"GROUP_RANK", "NODE", "HOST", "WORKERS", "PLACE", "LAST_HEARTBEAT"}};
  for (const auto& n : j["nodes"]) {
    const int rank = n["group_rank"];
    std::string place = n["place"];
    if (n["succeeded"].get<bool>()) place += ", succeeded";
    rows.push_back({rank >= 0 ? std::to_string(rank) : "-", n["node"], n["host"],
                    std::to_string(n["local_world_size"].get<int>()), place,
                    n["last_heartbeat_age_s"].is_null()
                        ? std::string("gone")
                        : seconds_text(n["last_heartbeat_age_s"].get<double>()) + " ago"});
  }
  out += table(rows);
  if (j["steps"].is_object()) out += step_table(j["steps"]);
  return out;
}

Json jobs_json(const Json& jobs_answer) {
  Json list = Json::array();
  if (jobs_answer.contains("jobs") && jobs_answer["jobs"].is_array()) {
    for (const auto& j : jobs_answer["jobs"]) {
      list.push_back({{"job", j.value("job", "")},
                      {"state", j.value("state", "")},
                      {"round", j.value("round", 0)},
                      {"nodes", j.value("nodes", 0)},
                      {"restarts", j.value("restarts", 0)},
                      {"faults_injected", j.value("faults_injected", 0)},
                      {"connections", j.value("connections", 0)},
                      {"keys", j.value("keys", 0)}});
    }
  }
  return Json{{"jobs", std::move(list)}};
}

std::string jobs_table(const Json& jobs_answer) {
  const Json j = jobs_json(jobs_answer);
  if (j["jobs"].empty()) return "no jobs\n";
  std::vector<std::vector<std::string>> rows{
      {"JOB", "STATE", "ROUND", "NODES", "RESTARTS", "CONNECTIONS", "KEYS"}};
  for (const auto& job : j["jobs"]) {
    rows.push_back(
        {job["job"], job["state"], std::to_string(job["round"].get<int>()),
         std::to_string(job["nodes"].get<int>()), std::to_string(job["restarts"].get<long long>()),
         std::to_string(job["connections"].get<int>()), std::to_string(job["keys"].get<int>())});
  }
  return table(rows);
}

}  // namespace ctrun::launcher
