#include "launcher/cluster/cluster_job.h"

#include <algorithm>

#include "ctrun/launcher/options.h"

namespace ctrun::launcher {

namespace {

// The failed rank's own summary: the rendezvous tells the other nodes "node 'ID' failed: " and
// the summary the failing node reported.
std::string first_failure(const std::string& reason) {
  const std::string marker = "' failed: ";
  const auto at = reason.find(marker);
  if (reason.rfind("node '", 0) == 0 && at != std::string::npos) {
    return reason.substr(at + marker.size());
  }
  return reason;
}

}  // namespace

ClusterJob::ClusterJob(std::vector<std::string> hosts, int min_nodes)
    : hosts_(std::move(hosts)), running_(hosts_.size(), true), min_nodes_(min_nodes) {}

int ClusterJob::running() const {
  return static_cast<int>(std::count(running_.begin(), running_.end(), true));
}

std::string ssh_error_line(const std::vector<std::string>& stderr_lines) {
  for (auto it = stderr_lines.rbegin(); it != stderr_lines.rend(); ++it) {
    const std::string& line = *it;
    // "2026-11-27T23:51:39.744Z ctrun: ...": rendezvous::log_line's, the host's agent speaking.
    const bool agent_line =
        line.size() > 25 && line[4] == '-' && line[10] == 'T' && line[23] == 'Z' && line[24] == ' ';
    if (!agent_line && !line.empty()) return line;
  }
  return "";
}

ClusterActions ClusterJob::session_ended(int host, const SessionEnd& end) {
  ClusterActions a;
  if (host < 0 || host >= static_cast<int>(hosts_.size()) || !running_[host]) return a;
  running_[host] = false;
  const std::string& name = hosts_[host];
  if (!end.job_failure.empty() && failure_.empty()) failure_ = first_failure(end.job_failure);
  const bool clean = end.exit_code == 0 && end.signal == 0;
  if (clean) {
    ++finished_;
  } else if (!stopping_) {
    // Why, in one line: ssh's own words when ssh failed, else the agent's code.
    std::string why;
    if (end.signal != 0) {
      why = "ssh was killed by " + signal_name(end.signal);
    } else if (end.exit_code == 255) {
      why = !end.ssh_error.empty()
                ? end.ssh_error
                : "ssh ended with code 255 and said nothing: the connection to the host was lost";
    } else {
      why = "its agent exited with code " + std::to_string(end.exit_code);
      if (!end.job_failure.empty()) why += " (" + first_failure(end.job_failure) + ")";
    }
    if (!failed_code_) failed_code_ = end.signal != 0 ? 128 + end.signal : end.exit_code;
    failed_hosts_.push_back(name + ": " + why);
    a.lines.push_back("host " + name + ": " + why);
    const int left = running();
    if (!failure_.empty()) {
      // The job failed; every agent learns it from the rendezvous and ends on its own.
    } else if (left > 0 && left < min_nodes_) {
      return stop_all(std::move(a), std::to_string(left) + " of " + std::to_string(hosts_.size()) +
                                        " hosts are left, below --nnodes' minimum of " +
                                        std::to_string(min_nodes_));
    } else if (left > 0) {
      a.lines.push_back("host " + name + " is lost to the job; " + std::to_string(left) +
                        " hosts run on (the job re-forms without it)");
    }
  }
  if (running() == 0) return finish(std::move(a));
  return a;
}

ClusterActions ClusterJob::signal(int signo) {
  ClusterActions a;
  if (stop_signal_ != 0 || stopping_) {
    if (stop_signal_ == 0) stop_signal_ = signo;
    a.lines.push_back(signal_name(signo) + " again: ending every ssh session now");
    for (int i = 0; i < static_cast<int>(running_.size()); ++i) {
      if (running_[i]) a.kill.push_back(i);
    }
    return a;
  }
  stop_signal_ = signo;
  return stop_all(std::move(a), signal_name(signo));
}

ClusterActions ClusterJob::stop_grace_over() {
  ClusterActions a;
  std::string late;
  for (int i = 0; i < static_cast<int>(running_.size()); ++i) {
    if (!running_[i]) continue;
    a.kill.push_back(i);
    late += (late.empty() ? "" : ", ") + hosts_[i];
  }
  if (!late.empty()) {
    a.lines.push_back("host " + late + " did not stop within the grace: ending its ssh session");
  }
  return a;
}

ClusterActions ClusterJob::stop_all(ClusterActions a, const std::string& why) {
  stopping_ = true;
  for (int i = 0; i < static_cast<int>(running_.size()); ++i) {
    if (running_[i]) a.close_input.push_back(i);
  }
  if (!a.close_input.empty()) {
    a.lines.push_back(why + ": stopping the job on " + std::to_string(a.close_input.size()) +
                      " host" + (a.close_input.size() == 1 ? "" : "s"));
    a.arm_stop_grace = true;
  }
  if (running() == 0) return finish(std::move(a));
  return a;
}

ClusterActions ClusterJob::finish(ClusterActions a) {
  if (stop_signal_ != 0) {
    a.lines.push_back("stopped on every host (" + signal_name(stop_signal_) + ")");
    a.exit_signal = stop_signal_;
    a.exit_code = 128 + stop_signal_;
    return a;
  }
  std::string lost;
  for (const auto& f : failed_hosts_) lost += (lost.empty() ? "" : "; ") + f;
  if (failure_.empty() && finished_ > 0 && !stopping_) {
    // An elastic job that lost hosts and finished on the others succeeded.
    a.lines.push_back("the job finished on " + std::to_string(finished_) + " of " +
                      std::to_string(hosts_.size()) + " hosts" +
                      (lost.empty() ? "" : "; lost on the way: " + lost));
    a.exit_code = 0;
    return a;
  }
  a.exit_code = failed_code_ && *failed_code_ != 0 ? *failed_code_ : 1;
  if (!failure_.empty()) {
    // Each host's reason was said as it ended; the summary names the hosts.
    std::string names;
    for (const auto& f : failed_hosts_)
      names += (names.empty() ? "" : ", ") + f.substr(0, f.find(':'));
    a.lines.push_back("the job failed: " + failure_ +
                      (names.empty() ? "" : " (hosts " + names + ")"));
  } else {
    a.lines.push_back("the job failed" + (lost.empty() ? std::string() : ": " + lost));
  }
  return a;
}

}  // namespace ctrun::launcher
