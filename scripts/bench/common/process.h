// Small process helpers shared by the benchmarks: spawn (posix_spawn, so never a bare fork of a
// threaded process), bounded waits, kill by PID, and /proc readings. Every wait takes a
// deadline: a benchmark must never hang.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

// A child we started. The destructor kills it (SIGKILL) and reaps it if it is still running.
class Child {
 public:
  struct Options {
    std::vector<std::string> argv;
    int stdin_fd = -1;            // -1: /dev/null
    bool capture_stdout = false;  // true: readable through read_line()
    std::string stderr_path;      // empty: inherit
  };

  static Child spawn(const Options& options);  // throws std::runtime_error
  Child() = default;
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  ~Child();

  pid_t pid() const { return pid_; }
  // One line of the child's stdout without its '\n'; nullopt at EOF or at the deadline.
  std::optional<std::string> read_line(Clock::time_point deadline);
  // SIGTERM, then SIGKILL after `grace`; returns the exit status (as from waitpid).
  int stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  // Waits for a voluntary exit until the deadline; nullopt if still running.
  std::optional<int> wait_until(Clock::time_point deadline);

 private:
  void release();
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
};

// A pipe whose ends are close-on-exec (only what a Child maps in explicitly is inherited).
struct Pipe {
  int read_fd = -1;
  int write_fd = -1;
  static Pipe create();
  Pipe() = default;
  Pipe(int r, int w) : read_fd(r), write_fd(w) {}
  Pipe(Pipe&& other) noexcept;
  Pipe& operator=(Pipe&& other) noexcept;
  ~Pipe();
  void close_read();
  void close_write();
};

// Waits until `path` holds a newline-terminated decimal port number.
std::optional<int> wait_for_port_file(const std::string& path, Clock::time_point deadline);

// VmHWM (peak resident set) of a live process, in KiB; 0 if unreadable.
long read_vm_hwm_kib(pid_t pid);
// utime + stime of a live process, in seconds; -1 if unreadable.
double read_cpu_seconds(pid_t pid);

// Raises RLIMIT_NOFILE's soft limit to the hard limit (as root, both to 1,048,576, what the
// packaged ctrund unit sets); returns the new soft limit. Children inherit it.
long raise_nofile_limit();

// Makes a fresh directory under $TMPDIR (or /tmp); removed by the caller.
std::string make_temp_dir(const std::string& prefix);
void remove_tree(const std::string& path);

// The calling process dies with SIGKILL when its parent dies (for role processes).
void die_with_parent();

// Registers SIGINT/SIGTERM handlers that SIGKILL every live Child and exit 130, so an
// interrupted benchmark leaves nothing behind.
void install_cleanup_handlers();

}  // namespace bench
