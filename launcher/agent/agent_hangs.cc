// The agent's hang reports (docs/faults.md, "Hang reports"): the watch that answers every dump
// request of the job with this node's workers' stacks and last steps (dump_watch.h), and the
// report the agent whose watchdog found a hung worker makes of the whole job's answers
// (hang_report.h) before that worker is killed.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "launcher/agent/agent_impl.h"
#include "launcher/agent/agent_os.h"
#include "launcher/diagnosis/native_stack_probe.h"
#include "launcher/diagnosis/native_stacks.h"
#include "launcher/workers/captured_run.h"
#include "python_helper.h"
#include "rendezvous/base/log.h"

namespace ctrun::launcher {

namespace {

// A Python worker's faulthandler writes its stacks at once; a worker stopped in the kernel
// (a D state) may take longer, and is then reported without them.
constexpr std::chrono::milliseconds kPythonStacksWait{3000};
constexpr std::chrono::milliseconds kNativeStacksWait{5000};
// torch's Flight Recorder dumps on a byte to its pipe from its monitoring thread, which looks
// about once a second.
constexpr std::chrono::milliseconds kFlightDumpWait{5000};
constexpr std::size_t kMaxStacksBytes = 64 * 1024;

std::optional<std::uintmax_t> file_size_of(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return std::nullopt;
  return size;
}

std::string read_from(const std::string& path, std::uintmax_t offset) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string text(kMaxStacksBytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  return text;
}

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return text.substr(0, std::min<std::size_t>(end, 300));
}

}  // namespace

int Agent::Impl::stacks_signal() { return SIGRTMIN + 6; }

void Agent::Impl::start_dump_watch() {
  DumpWatch::Hooks hooks;
  hooks.add = [this](std::string key, std::int64_t delta) -> Task<rdzv::Result<std::int64_t>> {
    co_return co_await client_->add(std::move(key), delta);
  };
  hooks.set = [this](std::string key, std::string value) -> Task<rdzv::Status> {
    co_return co_await client_->set(std::move(key), std::move(value));
  };
  hooks.get = [this](std::string key,
                     std::chrono::milliseconds timeout) -> Task<rdzv::Result<std::string>> {
    co_return co_await client_->get(std::move(key), timeout);
  };
  hooks.answer = [this]() -> Task<rdzv::Json> { co_return co_await take_dump_answer(); };
  hooks.group_rank = [this]() {
    return machine_ && machine_->watching_workers() ? machine_->round().group_rank : -1;
  };
  hooks.log = [](const std::string& line) { log(line); };
  hooks.wall_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  dumps_ = std::make_shared<DumpWatch>(io_.get_executor(), std::move(hooks));
  dumps_->start();
}

Task<rdzv::Json> Agent::Impl::take_dump_answer() {
  const rdzv::RoundAssignment round = machine_->round();
  const std::string host = rdzv::local_host_name();
  std::vector<RankStacks> taken;
  std::vector<int> local_ranks;
  // Python workers first, all at once: a signal each, on which faulthandler writes every
  // thread's stack to the worker's stacks file (sitecustomize.py) while it runs on.
  std::vector<std::pair<std::size_t, std::uintmax_t>> signalled;  // (index, size before)
  for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
    const int pid = workers_->running_pid(local_rank);
    if (pid == 0) continue;
    const auto slot = static_cast<std::size_t>(local_rank);
    RankStacks r;
    r.rank = round.rank_offset + local_rank;
    r.node = round.group_rank;
    r.host = host;
    r.pid = pid;
    r.step = reported_step_of(local_rank);
    r.hung = hung_stacks_.count(pid) != 0;
    if (slot < stacks_files_.size() && !stacks_files_[slot].empty()) {
      // The file exists once the worker's sitecustomize registered the handler: before that
      // the signal would end the worker.
      if (auto size = file_size_of(stacks_files_[slot]);
          size && ::kill(pid, stacks_signal()) == 0) {
        signalled.emplace_back(taken.size(), *size);
      }
    }
    taken.push_back(std::move(r));
    local_ranks.push_back(local_rank);
  }
  // Written once each file has grown and then stayed the same for one look.
  std::vector<std::uintmax_t> seen(signalled.size(), 0);
  const auto python_deadline = std::chrono::steady_clock::now() + kPythonStacksWait;
  while (!signalled.empty() && std::chrono::steady_clock::now() < python_deadline) {
    co_await linger(std::chrono::milliseconds(100));
    bool all = true;
    for (std::size_t i = 0; i < signalled.size(); ++i) {
      const auto [index, before] = signalled[i];
      const auto slot = static_cast<std::size_t>(local_ranks[index]);
      const auto size = file_size_of(stacks_files_[slot]).value_or(0);
      all = all && size > before && size == seen[i];
      seen[i] = size;
    }
    if (all) break;
  }
  for (const auto& [index, before] : signalled) {
    const auto slot = static_cast<std::size_t>(local_ranks[index]);
    taken[index].python_stacks = read_from(stacks_files_[slot], before);
    if (taken[index].python_stacks.empty()) {
      taken[index].error =
          "no Python stacks within " + std::to_string(kPythonStacksWait.count() / 1000) + " s";
    }
  }
  // Native stacks where there are no Python ones (C++ workers): eu-stack, one at a time (one
  // tracer per process). A worker being killed as hung has its own taken already.
  for (RankStacks& r : taken) {
    if (!r.python_stacks.empty()) continue;
    if (auto hung = hung_stacks_.find(r.pid); hung != hung_stacks_.end()) {
      const auto deadline = std::chrono::steady_clock::now() + kNativeStacksWait;
      while (hung_stacks_[r.pid].empty() && std::chrono::steady_clock::now() < deadline) {
        co_await linger(std::chrono::milliseconds(50));
      }
      r.native_stacks = summarize_native_stacks(hung_stacks_[r.pid]);
      continue;
    }
    NativeStacks stacks =
        co_await capture_native_stacks(io_.get_executor(), r.pid, kNativeStacksWait);
    if (stacks.taken) {
      r.native_stacks = summarize_native_stacks(stacks.text);
    } else if (r.error.empty()) {
      r.error = first_line(stacks.text);
    }
  }
  rdzv::Json ranks = rdzv::Json::array();
  for (const RankStacks& r : taken) ranks.push_back(rank_stacks_json(r));
  rdzv::Json flight = rdzv::Json::array();
  if (options_.flight_recorder) {
    for (std::size_t i = 0; i < taken.size(); ++i) {
      if (auto record = co_await read_flight_record(local_ranks[i], taken[i].rank)) {
        flight.push_back(flight_record_json(*record));
      }
    }
  }
  co_return rdzv::Json{{"node", round.group_rank},
                       {"nodes", round.group_world_size},
                       {"host", host},
                       {"ranks", ranks},
                       {"flight", flight}};
}

Task<std::optional<FlightRecord>> Agent::Impl::read_flight_record(int local_rank, int rank) {
  const std::string prefix = flight_recorder_prefix(local_rank);
  const std::string dump = prefix + std::to_string(rank);
  const std::string pipe = dump + ".pipe";
  struct stat st {};
  if (::stat(pipe.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) {
    if (::stat(dump.c_str(), &st) != 0) co_return std::nullopt;  // no recorder in this worker
  } else {
    // A byte on the pipe asks torch for a dump; the dump is there once it changed and settled.
    const std::int64_t before = modification_stamp(dump);
    const int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      [[maybe_unused]] const auto n = ::write(fd, "1", 1);
      ::close(fd);
    }
    const auto deadline = std::chrono::steady_clock::now() + kFlightDumpWait;
    std::int64_t seen = before;
    while (std::chrono::steady_clock::now() < deadline) {
      co_await linger(std::chrono::milliseconds(200));
      const std::int64_t now = modification_stamp(dump);
      if (now != before && now == seen) break;
      seen = now;
    }
  }
  if (::stat(dump.c_str(), &st) != 0) {
    log("hang report: rank " + std::to_string(rank) + ": no NCCL Flight Recorder dump at " + dump);
    co_return std::nullopt;
  }
  // Named first: g++ 12 mishandles braced lists inside a co_await's operand.
  const std::vector<std::string> args = {python_helper_dir_ + "/" + kPythonHelperName, "fr_summary",
                                         dump, std::to_string(rank)};
  const std::string python = python_executable();
  const CapturedRun run =
      co_await run_captured(io_.get_executor(), python, args, std::chrono::seconds(20), 1 << 20);
  rdzv::Json j = rdzv::Json::parse(run.text, nullptr, /*allow_exceptions=*/false);
  auto record = run.succeeded ? flight_record_from_json(j) : std::nullopt;
  if (!record) {
    log("hang report: rank " + std::to_string(rank) + ": cannot read the Flight Recorder dump " +
        dump + ": " + first_line(run.text));
  }
  co_return record;
}

void Agent::Impl::start_hang_report(const std::string& reason) {
  if (!dumps_ || options_.hang_report_timeout <= 0 || hang_report_pending_) return;
  hang_report_pending_ = true;
  spawn([this, reason]() -> Task<void> { co_await report_hang(reason); });
}

Task<void> Agent::Impl::report_hang(std::string reason) {
  const int nodes = machine_->round().group_world_size;
  const std::string attempt = std::filesystem::path(worker_dir(0)).parent_path().string();
  const auto timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(seconds(options_.hang_report_timeout));
  auto outcome = co_await dumps_->report(reason, nodes, timeout);
  hang_report_pending_ = false;
  if (!outcome) {
    log("hang report: not made: " + outcome.error().message);
    co_return;
  }
  const DumpWatch::Outcome& o = outcome.value();
  const std::vector<std::string> lines = hang_report_lines(o.report);
  const std::string name = "hang report " + std::to_string(o.request);
  rdzv::Json json = hang_report_json(o.report, o.job.ranks);
  json["request"] = o.request;
  json["reason"] = reason;
  const std::string path = attempt + "/hang_report_" + std::to_string(o.request) + ".json";
  const bool written = write_text_file_atomically(path, json.dump(2) + "\n");
  std::string text = "Hang report (" + reason + "):\n";
  for (const auto& line : lines) {
    log(name + ": " + line);
    text += "  " + line + "\n";
  }
  if (written) {
    log(name + ": every rank's stacks in " + path);
    text += "  every rank's stacks: " + path + "\n";
  } else {
    log("warning: " + name + ": cannot write " + path + ": " + std::strerror(errno));
  }
  event("hang_report", {{"request", o.request},
                        {"suspects", o.report.suspects},
                        {"summary", lines},
                        {"file", written ? path : ""}});
  hang_report_text_ = text;
}

}  // namespace ctrun::launcher
