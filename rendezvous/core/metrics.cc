#include "rendezvous/core/metrics.h"

namespace ctrun::rendezvous {
namespace {

// A label value as the exposition format wants it: backslash, quote and newline escaped.
std::string label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  template <typename T>
  void sample(const char* name, T value, const std::string& labels = "") {
    out_ += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " +
            std::to_string(value) + "\n";
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

std::string prometheus_text(const ServiceMetrics& m) {
  Writer w;
  w.family("ctrund_requests_total", "counter", "Requests handled, by operation.");
  for (const auto& [op, n] : m.requests)
    w.sample("ctrund_requests_total", n, "op=\"" + label(op) + "\"");
  w.family("ctrund_connections_accepted_total", "counter", "Client connections accepted.");
  w.sample("ctrund_connections_accepted_total", m.connections_accepted);
  w.family("ctrund_connections_refused_total", "counter",
           "Client connections refused at a connection limit.");
  w.sample("ctrund_connections_refused_total", m.connections_refused);
  w.family("ctrund_frame_errors_total", "counter",
           "Connections closed for a malformed, oversized or late frame or request.");
  w.sample("ctrund_frame_errors_total", m.frame_errors);
  w.family("ctrund_auth_failures_total", "counter", "Hellos refused for a missing or wrong token.");
  w.sample("ctrund_auth_failures_total", m.auth_failures);
  w.family("ctrund_rounds_formed_total", "counter", "Rendezvous rounds formed, over every job.");
  w.sample("ctrund_rounds_formed_total", m.rounds_formed);
  w.family("ctrund_restarts_total", "counter", "Job restarts taken by agents, over every job.");
  w.sample("ctrund_restarts_total", m.restarts);
  w.family("ctrund_faults_injected_total", "counter",
           "Faults injected on purpose by agents (ctrun --faults), over every job.");
  w.sample("ctrund_faults_injected_total", m.faults_injected);
  w.family("ctrund_connections", "gauge", "Client connections open now.");
  w.sample("ctrund_connections", m.connections);

  std::map<std::string, int> by_state{
      {"running", 0}, {"succeeded", 0}, {"failed", 0}, {"closed", 0}, {"store", 0}};
  std::size_t nodes = 0;
  std::size_t keys = 0;
  for (const auto& j : m.jobs) {
    ++by_state[j.state];
    nodes += j.nodes;
    keys += j.keys;
  }
  w.family("ctrund_jobs", "gauge", "Jobs known to the daemon, by state.");
  for (const auto& [state, n] : by_state)
    w.sample("ctrund_jobs", n, "state=\"" + label(state) + "\"");
  w.family("ctrund_nodes", "gauge", "Nodes in every job's rendezvous.");
  w.sample("ctrund_nodes", nodes);
  w.family("ctrund_store_keys", "gauge", "Keys in every job's store.");
  w.sample("ctrund_store_keys", keys);

  w.family("ctrund_job_round", "gauge", "The job's current rendezvous round.");
  for (const auto& j : m.jobs)
    w.sample("ctrund_job_round", j.round, "job=\"" + label(j.job) + "\"");
  w.family("ctrund_job_nodes", "gauge", "Nodes in the job's rendezvous.");
  for (const auto& j : m.jobs)
    w.sample("ctrund_job_nodes", j.nodes, "job=\"" + label(j.job) + "\"");
  w.family("ctrund_job_restarts", "gauge", "Restarts the job has used.");
  for (const auto& j : m.jobs) {
    w.sample("ctrund_job_restarts", j.restarts, "job=\"" + label(j.job) + "\"");
  }
  w.family("ctrund_job_faults_injected", "gauge",
           "Faults injected on purpose into the job (ctrun --faults), apart from real failures.");
  for (const auto& j : m.jobs) {
    w.sample("ctrund_job_faults_injected", j.faults_injected, "job=\"" + label(j.job) + "\"");
  }
  w.family("ctrund_job_store_keys", "gauge", "Keys in the job's store.");
  for (const auto& j : m.jobs) {
    w.sample("ctrund_job_store_keys", j.keys, "job=\"" + label(j.job) + "\"");
  }
  // Jobs whose agents judge step times only (a job whose workers report no steps has none).
  w.family("ctrund_job_step_seconds_median", "gauge",
           "The median time of a training step over the job's ranks, in seconds.");
  for (const auto& j : m.jobs) {
    if (!j.steps_judged) continue;
    w.sample("ctrund_job_step_seconds_median", j.median_step_seconds,
             "job=\"" + label(j.job) + "\"");
  }
  w.family("ctrund_job_stragglers", "gauge",
           "Ranks of the job whose steps are slower than the median by the agents' factor.");
  for (const auto& j : m.jobs) {
    if (!j.steps_judged) continue;
    w.sample("ctrund_job_stragglers", j.stragglers.size(), "job=\"" + label(j.job) + "\"");
  }
  w.family("ctrund_job_straggler_slowdown", "gauge",
           "How many times the job's median a straggling rank's own time per step is (its step "
           "time where its waits for the others are not measured).");
  for (const auto& j : m.jobs) {
    for (const auto& [rank, slowdown] : j.stragglers) {
      w.sample("ctrund_job_straggler_slowdown", slowdown,
               "job=\"" + label(j.job) + "\",rank=\"" + std::to_string(rank) + "\"");
    }
  }
  w.family("ctrund_job_straggler_holds_seconds", "gauge",
           "How long a straggling rank keeps the job's other ranks waiting in each step, in "
           "seconds.");
  for (const auto& j : m.jobs) {
    for (const auto& [rank, holds] : j.straggler_holds) {
      w.sample("ctrund_job_straggler_holds_seconds", holds,
               "job=\"" + label(j.job) + "\",rank=\"" + std::to_string(rank) + "\"");
    }
  }
  return w.take();
}

}  // namespace ctrun::rendezvous
