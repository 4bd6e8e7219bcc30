// The decisions of `ctrun --hostfile` while its hosts' agents run, one ssh session each: what a
// session's end means (the job's own end, a host that failed, a host lost), when to stop the
// others, and the launcher's exit code. Pure: the shell (cluster_launcher.cc) feeds it what
// happens and carries out what it returns; unit-tested in memory.
//
// Stopping is exact: the launcher closes a session's input, and that host's agent (started with
// --stop_on_stdin_close) stops its own workers as on SIGTERM; if a session outlives the stop
// grace, the ssh process is killed, which ends the session (and the agent's input) too.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ctrun::launcher {

// The last line of a session's stderr that ssh wrote about the connection: ctrun's own log
// lines from the host (a time stamp, then "ctrun") are the agent's, never ssh's. Empty: none.
std::string ssh_error_line(const std::vector<std::string>& stderr_lines);

// How one host's session ended.
struct SessionEnd {
  int exit_code = 0;  // ssh's: the agent's code, 255 when ssh itself failed
  int signal = 0;     // the ssh process was killed by this signal
  // The last line ssh wrote about the connection ("ssh: connect to host h port 22: Connection
  // refused"); empty when there is none.
  std::string ssh_error;
  // The job's end as the agent saw it ("rank 3 on h2: ..."), when its output said so.
  std::string job_failure;
};

struct ClusterActions {
  std::vector<int> close_input;    // hosts (by index) whose agents are asked to stop
  std::vector<int> kill;           // hosts whose ssh is SIGTERMed (their sessions end)
  std::vector<std::string> lines;  // the launcher's own lines ("ctrun: " is added)
  bool arm_stop_grace = false;     // call stop_grace_over() after the shutdown grace
  std::optional<int> exit_code;    // every session has ended: exit with this
  int exit_signal = 0;             // ... or die of this signal (a stop by signal)
};

class ClusterJob {
 public:
  ClusterJob(std::vector<std::string> hosts, int min_nodes);

  ClusterActions session_ended(int host, const SessionEnd& end);
  ClusterActions signal(int signo);  // SIGINT, SIGTERM, SIGHUP: stop; a second one: kill
  ClusterActions stop_grace_over();

  int running() const;

 private:
  ClusterActions stop_all(ClusterActions a, const std::string& why);
  ClusterActions finish(ClusterActions a);

  std::vector<std::string> hosts_;
  std::vector<bool> running_;
  int min_nodes_;
  int finished_ = 0;  // sessions that ended with code 0
  bool stopping_ = false;
  int stop_signal_ = 0;
  std::optional<int> failed_code_;  // the first host failure's exit code
  std::string failure_;             // the job's failure as an agent reported it
  std::vector<std::string> failed_hosts_;
};

}  // namespace ctrun::launcher
