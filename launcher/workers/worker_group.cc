#include "launcher/workers/worker_group.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/readable_pipe.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "launcher/workers/child_process.h"
#include "launcher/workers/output_sink.h"
#include "launcher/workers/stderr_tail.h"
#include "rendezvous/base/open_files.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using rendezvous::Error;
using rendezvous::ErrorCode;

namespace {

// The descriptors the agent holds per worker: a pipe end per stream, the exit's pidfd, and the
// worker's log files.
std::size_t descriptors_for(const WorkerSpec& spec) {
  return 3 + (spec.stdout_file.empty() ? 0 : 1) + (spec.stderr_file.empty() ? 0 : 1);
}

std::size_t open_descriptors() {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

}  // namespace

struct WorkerGroup::Worker {
  Worker(asio::io_context& io, const WorkerSpec& spec)
      : local_rank(spec.local_rank),
        out_pipe(io),
        err_pipe(io),
        out(spec.stdout_console, spec.prefix, spec.stdout_file, spec.stdout_filtered),
        err(spec.stderr_console, spec.prefix, spec.stderr_file, spec.stderr_filtered) {}

  int local_rank;
  std::unique_ptr<bp::process> process;
  pid_t pid = 0;
  bool exited = false;
  asio::readable_pipe out_pipe;
  asio::readable_pipe err_pipe;
  OutputSink out;
  OutputSink err;
  StderrTail err_tail;  // for the failure report
  bool err_closed = false;
  std::optional<WorkerExit> outcome;
  bool exited_before_stop = false;  // dead (not yet reaped) when stop() sent its signal
  std::uint64_t exit_order = 0;
  std::array<char, 16384> out_buf;
  std::array<char, 16384> err_buf;
};

namespace {

// `tail` and `closed` (stderr only, else null) keep the stream's last lines and its end.
template <typename Buffer>
void read_stream(asio::readable_pipe& pipe, Buffer& buf, OutputSink& sink, StderrTail* tail,
                 bool* closed, std::shared_ptr<void> keep_alive, std::weak_ptr<int> group_alive) {
  auto on_read = [&pipe, &buf, &sink, tail, closed, keep_alive, group_alive](
                     boost::system::error_code ec, std::size_t n) {
    if (group_alive.expired()) return;
    if (n > 0) sink.write(buf.data(), n);
    if (n > 0 && tail) tail->append(buf.data(), n);
    if (ec) {
      sink.finish();
      if (closed) *closed = true;
      return;
    }
    read_stream(pipe, buf, sink, tail, closed, keep_alive, group_alive);
  };
  pipe.async_read_some(asio::buffer(buf), on_read);
}

}  // namespace

WorkerGroup::WorkerGroup(asio::io_context& io) : io_(io), grace_timer_(io) {}

WorkerGroup::~WorkerGroup() {
  kill_groups(SIGKILL);
  alive_.reset();
  // Each bp::process that is still running is killed and reaped by its own destructor: Boost
  // stays the only one that waits for our children.
}

rendezvous::Status WorkerGroup::ensure_descriptors(const std::vector<WorkerSpec>& specs) {
  // Room for what the agent opens meanwhile (connections, a failure's eu-stack, files).
  constexpr std::size_t kHeadroom = 32;
  std::size_t needed = open_descriptors() + kHeadroom;
  for (const auto& spec : specs) needed += descriptors_for(spec);
  // An agent that hosts the job's store raised its limit at start: its workers get the user's.
  if (auto before = rendezvous::open_file_limit_before_raise(); before && !user_open_files_) {
    auto as_rlim = [](std::uint64_t v) {
      return v == rendezvous::kNoFileLimit ? RLIM_INFINITY : static_cast<rlim_t>(v);
    };
    user_open_files_ = rlimit{as_rlim(before->soft), as_rlim(before->hard)};
  }
  rlimit now{};
  if (getrlimit(RLIMIT_NOFILE, &now) != 0 || now.rlim_cur == RLIM_INFINITY ||
      now.rlim_cur >= needed) {
    return rendezvous::ok_status();
  }
  if (now.rlim_max != RLIM_INFINITY && now.rlim_max < needed) {
    return Error{ErrorCode::kLimit,
                 std::to_string(specs.size()) + " workers need about " + std::to_string(needed) +
                     " open files in the agent (pipes, log files), and ulimit -n allows " +
                     std::to_string(now.rlim_cur) + " (hard limit " + std::to_string(now.rlim_max) +
                     "): raise it, e.g. ulimit -n " + std::to_string(needed)};
  }
  // Within the hard limit: the agent raises its own, and its workers get the user's back.
  if (!user_open_files_) user_open_files_ = now;
  rlimit raised = now;
  raised.rlim_cur = needed;
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    return Error{ErrorCode::kLimit, "cannot raise the open-file limit (ulimit -n " +
                                        std::to_string(now.rlim_cur) + ") to " +
                                        std::to_string(needed) + ": " + std::strerror(errno)};
  }
  return rendezvous::ok_status();
}

rendezvous::Status WorkerGroup::start(std::vector<WorkerSpec> specs, ExitHandler on_exit) {
  on_exit_ = std::move(on_exit);
  stopping_ = false;
  kill_groups(SIGKILL);  // whatever the last group left behind goes before its pgids are forgotten
  workers_.clear();
  if (auto s = ensure_descriptors(specs); !s) return s;
  for (const auto& spec : specs) {
    auto launched = launch(spec);
    if (!launched) {
      kill_groups(SIGKILL);
      return launched.error();
    }
    workers_.push_back(std::move(launched).value());
  }
  return rendezvous::ok_status();
}

rendezvous::Status WorkerGroup::restart(WorkerSpec spec) {
  auto old = std::find_if(workers_.begin(), workers_.end(),
                          [&](const auto& w) { return w->local_rank == spec.local_rank; });
  if (old == workers_.end() || !(*old)->exited) {
    return Error{ErrorCode::kInternal,
                 "local rank " + std::to_string(spec.local_rank) + " is not an exited worker"};
  }
  // What the old worker left in its process group goes with it.
  if ((*old)->pid > 0) ::kill(-(*old)->pid, SIGKILL);
  if (auto s = ensure_descriptors({spec}); !s) return s;
  auto launched = launch(spec);
  if (!launched) return launched.error();
  *old = std::move(launched).value();
  return rendezvous::ok_status();
}

rendezvous::Result<std::shared_ptr<WorkerGroup::Worker>> WorkerGroup::launch(
    const WorkerSpec& spec) {
  auto w = std::make_shared<Worker>(io_, spec);
  for (OutputSink* sink : {&w->out, &w->err}) {
    sink->set_file_error_handler([this, rank = spec.local_rank, alive = std::weak_ptr<int>(alive_)](
                                     const std::string& path, int error) {
      if (!alive.expired() && on_log_error_) on_log_error_(rank, path, error);
    });
  }
  if (!w->out.file_ok() || !w->err.file_ok()) {
    const std::string& failed = w->out.file_ok() ? spec.stderr_file : spec.stdout_file;
    return Error{ErrorCode::kBadRequest, "cannot open log file '" + failed + "'"};
  }
  ChildOptions child;
  child.own_process_group = true;
  child.traceable_by_agent = true;
  child.binding = spec.binding;
  child.open_files = user_open_files_;
  child.environment = spec.env;
  auto started = start_child(io_.get_executor(), spec.command.executable, spec.command.args,
                             bp::process_stdio{{}, w->out_pipe, w->err_pipe}, child);
  if (!started) return started.error();
  w->process = std::move(started).value();
  w->pid = w->process->id();
  std::weak_ptr<int> alive = alive_;
  read_stream(w->out_pipe, w->out_buf, w->out, nullptr, nullptr, w, alive);
  read_stream(w->err_pipe, w->err_buf, w->err, &w->err_tail, &w->err_closed, w, alive);
  w->process->async_wait([this, w, alive](boost::system::error_code ec, int) {
    if (alive.expired()) return;
    on_worker_exit(*w, ec ? -1 : w->process->native_exit_code());
  });
  return w;
}

void WorkerGroup::on_worker_exit(Worker& w, int native_status) {
  w.exited = true;
  w.exit_order = ++exits_seen_;
  WorkerExit e;
  e.local_rank = w.local_rank;
  e.pid = w.pid;
  e.at = std::chrono::system_clock::now();
  if (native_status != -1 && WIFSIGNALED(native_status)) {
    e.signal = WTERMSIG(native_status);
  } else if (native_status != -1 && WIFEXITED(native_status)) {
    e.exit_code = WEXITSTATUS(native_status);
  } else {
    // The wait failed (e.g. the kernel reaped it because SIGCHLD was ignored): the outcome is
    // unknown, and unknown is not success.
    e.exit_code = 255;
  }
  w.outcome = e;
  if (!stopping_) w.exited_before_stop = true;
  if (stopping_) return check_stopped();
  if (on_exit_) on_exit_(e);
}

void WorkerGroup::stop(int signo, std::chrono::milliseconds grace, std::function<void()> done) {
  // A worker that already died but whose exit is not yet read (it failed together with the one
  // that made the agent stop the group) is a failure of its own, not of this stop: look without
  // reaping (WNOWAIT), Boost still reaps it.
  for (auto& w : workers_) {
    if (w->exited || w->pid <= 0) continue;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(w->pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == w->pid) {
      w->exited_before_stop = true;
    }
  }
  stopping_ = true;
  stopped_ = std::move(done);
  kill_groups(signo);
  grace_timer_.expires_after(grace);
  std::weak_ptr<int> alive = alive_;
  grace_timer_.async_wait([this, alive](boost::system::error_code ec) {
    if (ec || alive.expired()) return;
    kill_groups(SIGKILL);
    // A process stuck in the kernel (uninterruptible sleep) ignores even SIGKILL: after a last
    // bounded wait, stop waiting for it rather than hang the agent.
    grace_timer_.expires_after(std::chrono::seconds(10));
    grace_timer_.async_wait([this, alive](boost::system::error_code ec2) {
      if (ec2 || alive.expired()) return;
      for (auto& w : workers_) w->exited = true;
      check_stopped();
    });
  });
  check_stopped();
}

void WorkerGroup::check_stopped() {
  if (!stopping_ || running() > 0 || !stopped_) return;
  grace_timer_.cancel();
  kill_groups(SIGKILL);  // grandchildren left in the groups
  auto done = std::move(stopped_);
  stopped_ = nullptr;
  asio::post(io_, std::move(done));
}

void WorkerGroup::kill_groups(int signo) {
  for (auto& w : workers_) {
    if (w->pid > 0) ::kill(-w->pid, signo);
  }
}

void WorkerGroup::kill(int local_rank, int signo) {
  for (auto& w : workers_) {
    if (w->local_rank == local_rank && w->pid > 0 && !w->exited) ::kill(-w->pid, signo);
  }
}

WorkerGroup::Worker* WorkerGroup::find(int local_rank) const {
  for (const auto& w : workers_) {
    if (w->local_rank == local_rank) return w.get();
  }
  return nullptr;
}

void WorkerGroup::signal_process(int local_rank, int signo) {
  if (Worker* w = find(local_rank); w && w->pid > 0 && !w->exited) ::kill(w->pid, signo);
}

int WorkerGroup::running_pid(int local_rank) const {
  const Worker* w = find(local_rank);
  return w && !w->exited ? w->pid : 0;
}

std::vector<std::string> WorkerGroup::stderr_tail(int local_rank) const {
  const Worker* w = find(local_rank);
  return w ? w->err_tail.lines() : std::vector<std::string>{};
}

bool WorkerGroup::stderr_closed(int local_rank) const {
  const Worker* w = find(local_rank);
  return !w || w->err_closed;
}

void WorkerGroup::write_stderr_note(int local_rank, const std::string& text) {
  if (Worker* w = find(local_rank)) w->err.write_note(text);
}

std::vector<WorkerExit> WorkerGroup::failures() const {
  std::vector<const Worker*> failed;
  for (const auto& w : workers_) {
    if (w->outcome && !w->outcome->ok() && w->exited_before_stop) failed.push_back(w.get());
  }
  std::sort(failed.begin(), failed.end(),
            [](const Worker* a, const Worker* b) { return a->exit_order < b->exit_order; });
  std::vector<WorkerExit> out;
  for (const Worker* w : failed) out.push_back(*w->outcome);
  return out;
}

std::size_t WorkerGroup::running() const {
  std::size_t n = 0;
  for (const auto& w : workers_) n += w->exited ? 0 : 1;
  return n;
}

std::vector<int> WorkerGroup::pids() const {
  std::vector<int> out;
  for (const auto& w : workers_) out.push_back(w->pid);
  return out;
}

}  // namespace ctrun::launcher
