#include "launcher/agent/hung_worker_watch.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <csignal>
#include <cstdio>
#include <sstream>

#include "launcher/diagnosis/native_stack_probe.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
using rendezvous::Task;

namespace {

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(seconds));
}

}  // namespace

HungWorkerWatch::HungWorkerWatch(asio::io_context& io, Settings settings, WorkerRunner& workers,
                                 const HeartbeatFiles& files, Hooks hooks)
    : io_(io),
      settings_(settings),
      workers_(workers),
      files_(files),
      hooks_(std::move(hooks)),
      timer_(io),
      monitor_(milliseconds(settings.timeout)) {}

void HungWorkerWatch::start() {
  if (settings_.timeout > 0) arm();
}

void HungWorkerWatch::workers_started() {
  monitor_.reset(files_.stamps(), std::chrono::steady_clock::now());
  hung_.clear();
}

void HungWorkerWatch::worker_replaced(int local_rank) {
  monitor_.replace(local_rank, files_.stamp(local_rank), std::chrono::steady_clock::now());
}

std::optional<std::string> HungWorkerWatch::hung_stacks(int pid) const {
  auto it = hung_.find(pid);
  if (it == hung_.end()) return std::nullopt;
  return it->second;
}

void HungWorkerWatch::arm() {
  const auto interval = std::clamp<std::chrono::milliseconds>(
      milliseconds(settings_.timeout / 5), std::chrono::milliseconds(50), std::chrono::seconds(1));
  timer_.expires_after(interval);
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    check();
    arm();
  });
}

void HungWorkerWatch::check() {
  if (!hooks_.watching()) return;
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < files_.size(); ++i) monitor_.observe(i, files_.stamp(i), now);
  for (int local_rank : monitor_.take_overdue(now)) {
    char why[128];
    std::snprintf(why, sizeof why, "no heartbeat for %.1f s (--worker_timeout=%g): killed as hung",
                  std::chrono::duration<double>(monitor_.silent_for(local_rank, now)).count(),
                  settings_.timeout);
    const int pid = workers_.running_pid(local_rank);  // 0: it exited meanwhile, on its way
    if (pid != 0) hung_[pid] = "";
    hooks_.found(local_rank, pid, why);
    if (pid != 0) asio::co_spawn(io_, kill(local_rank, pid), asio::detached);
  }
}

Task<void> HungWorkerWatch::kill(int local_rank, int pid) {
  const std::string who = hooks_.who(local_rank);
  const std::string place = hooks_.stderr_place(local_rank);
  NativeStacks stacks =
      co_await capture_native_stacks(io_.get_executor(), pid, settings_.native_stacks_timeout);
  // Gone meanwhile (the group was stopped for another reason): a new group may use this rank.
  if (workers_.running_pid(local_rank) != pid) co_return;
  hung_[pid] = stacks.text;
  workers_.write_stderr_note(local_rank, "ctrun: " + who + " hung: native stacks (eu-stack -p " +
                                             std::to_string(pid) + "):\n" + stacks.text);
  if (stacks.taken) {
    hooks_.log(who + ": native stacks (eu-stack) written to " + place);
  } else {
    // One log line: eu-stack's words (its error, a timeout, the hint), not frames.
    std::string why;
    std::istringstream lines(stacks.text);
    for (std::string line; std::getline(lines, line) && why.size() < 600;) {
      if (!line.empty() && line[0] != '#') why += (why.empty() ? "" : "; ") + line;
    }
    hooks_.log(who + ": no native stacks: " + why.substr(0, 600));
  }
  // The job's hang report takes the other ranks' stacks while they still stand where they are.
  const auto report_deadline = std::chrono::steady_clock::now() +
                               milliseconds(settings_.hang_report_timeout) +
                               std::chrono::seconds(5);
  while (hooks_.reporting() && std::chrono::steady_clock::now() < report_deadline) {
    co_await rendezvous::sleep_for(std::chrono::milliseconds(50));
  }
  if (workers_.running_pid(local_rank) != pid) co_return;
  if (hooks_.python()) {
    // The abort is the agent's: no core file of what may be a process of many GiB.
    const rlimit no_core{0, 0};
    prlimit(pid, RLIMIT_CORE, &no_core, nullptr);
    workers_.signal_process(local_rank, SIGABRT);
    hooks_.log(who + ": sent SIGABRT: Python stacks (faulthandler) to " + place);
    const auto deadline = std::chrono::steady_clock::now() + settings_.python_stacks_timeout;
    while (workers_.running_pid(local_rank) == pid && std::chrono::steady_clock::now() < deadline) {
      co_await rendezvous::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // SIGKILL: a hung process may not run a SIGTERM handler. Its exit restarts the job.
  if (workers_.running_pid(local_rank) == pid) workers_.kill(local_rank, SIGKILL);
}

}  // namespace ctrun::launcher
