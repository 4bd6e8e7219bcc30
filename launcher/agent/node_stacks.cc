#include "launcher/agent/node_stacks.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/agent/agent_os.h"
#include "launcher/diagnosis/native_stack_probe.h"
#include "launcher/diagnosis/native_stacks.h"
#include "launcher/workers/captured_run.h"
#include "launcher/workers/heartbeat_files.h"
#include "python_helper.h"
#include "rendezvous/base/log.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;
using rdzv::Task;

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

NodeStacks::NodeStacks(asio::io_context& io, WorkerRunner& workers, bool flight_recorder,
                       std::string python_helper_dir, Hooks hooks)
    : io_(io),
      workers_(workers),
      flight_recorder_(flight_recorder),
      python_helper_dir_(std::move(python_helper_dir)),
      hooks_(std::move(hooks)) {}

int NodeStacks::signal() { return SIGRTMIN + 6; }

void NodeStacks::set_stacks_file(int local_rank, std::string path) {
  const auto slot = static_cast<std::size_t>(local_rank);
  if (slot < stacks_files_.size()) stacks_files_[slot] = std::move(path);
}

Task<rdzv::Json> NodeStacks::take(rdzv::RoundAssignment round) {
  const std::string host = rdzv::local_host_name();
  std::vector<RankStacks> taken;
  std::vector<int> local_ranks;
  // Python workers first, all at once: a signal each, on which faulthandler writes every
  // thread's stack to the worker's stacks file (sitecustomize.py) while it runs on.
  std::vector<std::pair<std::size_t, std::uintmax_t>> signalled;  // (index, size before)
  for (int local_rank = 0; local_rank < static_cast<int>(stacks_files_.size()); ++local_rank) {
    const int pid = workers_.running_pid(local_rank);
    if (pid == 0) continue;
    const auto slot = static_cast<std::size_t>(local_rank);
    RankStacks r;
    r.rank = round.rank_offset + local_rank;
    r.node = round.group_rank;
    r.host = host;
    r.pid = pid;
    r.step = hooks_.step(local_rank);
    r.hung = hooks_.hung_stacks(pid).has_value();
    if (slot < stacks_files_.size() && !stacks_files_[slot].empty()) {
      // The file exists once the worker's sitecustomize registered the handler: before that
      // the signal would end the worker.
      if (auto size = file_size_of(stacks_files_[slot]); size && ::kill(pid, signal()) == 0) {
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
    co_await rdzv::sleep_for(std::chrono::milliseconds(100));
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
    if (hooks_.hung_stacks(r.pid)) {
      const auto deadline = std::chrono::steady_clock::now() + kNativeStacksWait;
      while (hooks_.hung_stacks(r.pid).value_or("gone").empty() &&
             std::chrono::steady_clock::now() < deadline) {
        co_await rdzv::sleep_for(std::chrono::milliseconds(50));
      }
      r.native_stacks = summarize_native_stacks(hooks_.hung_stacks(r.pid).value_or(""));
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
  if (flight_recorder_) {
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

Task<std::optional<FlightRecord>> NodeStacks::read_flight_record(int local_rank, int rank) {
  const std::string prefix = flight_recorder_prefix(hooks_.worker_dir(local_rank));
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
      co_await rdzv::sleep_for(std::chrono::milliseconds(200));
      const std::int64_t now = modification_stamp(dump);
      if (now != before && now == seen) break;
      seen = now;
    }
  }
  if (::stat(dump.c_str(), &st) != 0) {
    hooks_.log("hang report: rank " + std::to_string(rank) + ": no NCCL Flight Recorder dump at " +
               dump);
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
    hooks_.log("hang report: rank " + std::to_string(rank) +
               ": cannot read the Flight Recorder dump " + dump + ": " + first_line(run.text));
  }
  co_return record;
}

}  // namespace ctrun::launcher
