#include "launcher/cluster/ssh_session.h"

#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/writable_pipe.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <optional>

#include "ctrun/launcher/failure_report.h"
#include "launcher/workers/child_process.h"
#include "launcher/workers/output_sink.h"
#include "launcher/workers/stderr_tail.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

namespace {
// How long the output may go on after ssh exited (a descendant holding the pipes, such as a
// connection master that has not let go of them yet) before the session counts as ended.
constexpr auto kOutputAfterExit = std::chrono::seconds(2);
}  // namespace

struct SshSession::State : std::enable_shared_from_this<SshSession::State> {
  State(asio::io_context& io, const std::string& prefix, const std::string& log_file)
      : in_pipe(io),
        out_pipe(io),
        err_pipe(io),
        out(1, prefix, log_file),
        err(2, prefix, log_file),
        linger(io) {}

  std::unique_ptr<bp::process> process;
  pid_t pid = 0;
  asio::writable_pipe in_pipe;
  asio::readable_pipe out_pipe;
  asio::readable_pipe err_pipe;
  OutputSink out;
  OutputSink err;
  StderrTail out_tail;  // the agent's last lines: where its "job ended (failed)" line is
  StderrTail err_tail;
  std::array<char, 16384> out_buf;
  std::array<char, 16384> err_buf;
  int streams_open = 2;
  std::optional<int> native_status;
  bool ended = false;
  asio::steady_timer linger;
  EndHandler on_end;

  // Reads one stream to its end, into the console, the log file and the stream's tail.
  void pump(bool stderr_stream) {
    auto& pipe = stderr_stream ? err_pipe : out_pipe;
    auto& buf = stderr_stream ? err_buf : out_buf;
    pipe.async_read_some(asio::buffer(buf), [self = shared_from_this(), stderr_stream](
                                                boost::system::error_code ec, std::size_t n) {
      auto& b = stderr_stream ? self->err_buf : self->out_buf;
      if (n > 0) {
        (stderr_stream ? self->err : self->out).write(b.data(), n);
        (stderr_stream ? self->err_tail : self->out_tail).append(b.data(), n);
      }
      if (ec) {
        --self->streams_open;
        self->maybe_end();
        return;
      }
      self->pump(stderr_stream);
    });
  }

  void maybe_end(bool forced = false) {
    if (ended || !native_status || (streams_open > 0 && !forced)) return;
    ended = true;
    linger.cancel();
    out.finish();
    err.finish();
    SessionEnd end;
    const int status = *native_status;
    if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) end.signal = WTERMSIG(status);
    end.ssh_error = ssh_error_line(err_tail.lines());
    for (const auto* tail : {&out_tail, &err_tail}) {
      for (const auto& line : tail->lines()) {
        const auto at = line.find(kJobFailedLine);
        if (at != std::string::npos) end.job_failure = line.substr(at + kJobFailedLine.size());
      }
    }
    if (on_end) on_end(end);
  }
};

SshSession::SshSession(asio::io_context& io, std::string prefix, std::string log_file)
    : state_(std::make_shared<State>(io, prefix, log_file)) {}

SshSession::~SshSession() {
  if (state_->process && !state_->native_status && state_->pid > 0) ::kill(state_->pid, SIGKILL);
  state_->on_end = nullptr;
}

rendezvous::Status SshSession::start(const std::vector<std::string>& argv, EndHandler on_end) {
  auto& s = *state_;
  if (!s.out.file_ok()) {
    return rendezvous::Error{rendezvous::ErrorCode::kBadRequest, "cannot open a host's log file"};
  }
  s.on_end = std::move(on_end);
  ChildOptions child;
  child.own_process_group = true;  // Ctrl-C in the terminal is the launcher's to act on
  auto started = start_child(s.in_pipe.get_executor(), argv.front(),
                             std::vector<std::string>(argv.begin() + 1, argv.end()),
                             bp::process_stdio{s.in_pipe, s.out_pipe, s.err_pipe}, child);
  if (!started) return started.error();
  s.process = std::move(started).value();
  s.pid = s.process->id();
  s.pump(false);
  s.pump(true);
  std::weak_ptr<State> weak = state_;
  s.process->async_wait([weak](boost::system::error_code ec, int) {
    auto st = weak.lock();
    if (!st) return;
    st->native_status = ec ? (255 << 8) : st->process->native_exit_code();
    st->linger.expires_after(kOutputAfterExit);
    st->linger.async_wait([weak](boost::system::error_code e) {
      if (auto st2 = weak.lock(); st2 && !e) st2->maybe_end(true);
    });
    st->maybe_end();
  });
  return rendezvous::ok_status();
}

void SshSession::close_input() {
  boost::system::error_code ignored;
  state_->in_pipe.close(ignored);
}

void SshSession::terminate() {
  if (state_->pid > 0 && !state_->native_status) ::kill(state_->pid, SIGTERM);
}

pid_t SshSession::pid() const { return state_->pid; }

}  // namespace ctrun::launcher
