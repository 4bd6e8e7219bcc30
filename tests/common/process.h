// Test helper: a child process started with fork/exec, stopped and reaped by PID when the test
// ends, whatever happens. Every wait is bounded.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ctrun::testing {

class ChildProcess {
 public:
  // stdout and stderr go to `log_path` (appended).
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int signo) const;
  // The exit status (a signal number N is reported as 128 + N), or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

std::string read_file(const std::string& path);
// How many times `what` occurs in `text`.
std::size_t count_of(const std::string& text, const std::string& what);
// KEY=VALUE lines of a file (an environment dump) as a map.
std::map<std::string, std::string> read_env_file(const std::string& path);
// Polls (bounded) until `path` holds a line, e.g. a port file written by a daemon.
std::optional<std::string> wait_for_file(const std::string& path,
                                         std::chrono::milliseconds timeout);
// Polls (bounded) until the file at `path` contains `text`.
bool wait_for_text(const std::string& path, const std::string& text,
                   std::chrono::milliseconds timeout);
std::string temp_path(const std::string& name);
// A listening socket that is never accepted from: connects complete (the kernel's backlog), and
// nothing is ever answered, like a hung daemon or another service holding a port. On 127.0.0.1,
// or on every interface; a free port.
class SilentListener {
 public:
  explicit SilentListener(bool every_interface = false);
  ~SilentListener();
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
std::uint16_t free_port();
// This machine's name as Python's socket.getfqdn() says it (/usr/bin/python3): torch 2.x's
// MASTER_ADDR for --standalone, which ctrun gives too.
std::string python_fqdn();
// What ctrun --standalone gives as MASTER_ADDR here: python_fqdn() where something can listen
// at the address it resolves to, else 127.0.0.1 (a host name this network namespace cannot
// serve: ctrun says so and keeps its store on loopback).
std::string standalone_master_addr();
// Whether this process may make a loopback-only network namespace (unshare -n; needs root).
bool can_unshare_network();

// Removes `path` and everything under it, quietly. Not std::filesystem::remove_all: pip
// LibTorch 2.x exports its own copy of that symbol, which crashes (null call) when a test
// linked with it calls remove_all.
void remove_tree(const std::string& path);

// A fresh directory under /tmp for one test, removed with everything in it at the end.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name = "scratch");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

// PYTHON_EXEC for the agents started while it lives: the system Python, whose torch the
// Python tests use (not the first python3 on PATH).
struct SystemPython {
  SystemPython();
  ~SystemPython();
  SystemPython(const SystemPython&) = delete;
  SystemPython& operator=(const SystemPython&) = delete;
};

// Starts the ctrund at `ctrund_path` on 127.0.0.1 (on `port`, 0: a free one) with `extra` flags,
// logging to DIR/NAME.log, and returns its port once it listens (a test failure after 10 s).
std::uint16_t start_ctrund(std::unique_ptr<ChildProcess>& daemon, const ScratchDir& dir,
                           const std::string& ctrund_path,
                           const std::vector<std::string>& extra = {}, std::uint16_t port = 0,
                           const std::string& name = "ctrund");

}  // namespace ctrun::testing
