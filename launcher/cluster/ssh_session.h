// One host's ssh session under `ctrun --hostfile`: the ssh client as a child process (its own
// process group, so the terminal's Ctrl-C reaches the launcher alone; killed if the launcher
// dies), its output streamed to the console as whole lines with the host's prefix and to the
// host's log file, its input held open until the launcher asks the host's agent to stop.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "launcher/cluster/cluster_job.h"

namespace ctrun::launcher {

class SshSession {
 public:
  using EndHandler = std::function<void(const SessionEnd&)>;

  // `prefix` starts each console line ("node1: "); `log_file` (may be empty) gets the same
  // lines without it.
  SshSession(boost::asio::io_context& io, std::string prefix, std::string log_file);
  ~SshSession();  // SIGKILLs an ssh still running
  SshSession(const SshSession&) = delete;
  SshSession& operator=(const SshSession&) = delete;

  // Starts `argv` (ssh and its arguments); `on_end` runs once, after the process has exited
  // and its output has been read to the end.
  rendezvous::Status start(const std::vector<std::string>& argv, EndHandler on_end);
  // Closes ssh's input: the host's agent (--stop_on_stdin_close) stops its workers and exits.
  void close_input();
  // SIGTERM to ssh: the session ends, and with it the agent's input.
  void terminate();
  pid_t pid() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ctrun::launcher
