// The agent's hang reports (docs/faults.md, "Hang reports"): the watch that answers every dump
// request of the job with this node's workers' stacks and last steps (dump_watch.h; the answer
// is node_stacks.h's), and the report the agent whose watchdog found a hung worker makes of the
// whole job's answers (hang_report.h) before that worker is killed.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "launcher/agent/agent_impl.h"
#include "launcher/agent/agent_os.h"
#include "rendezvous/base/log.h"

namespace ctrun::launcher {

std::unique_ptr<NodeStacks> Agent::Impl::make_node_stacks() {
  NodeStacks::Hooks hooks;
  hooks.log = [](const std::string& line) { log(line); };
  hooks.step = [this](int local_rank) { return heartbeat_files_.step(local_rank); };
  hooks.hung_stacks = [this](int pid) { return hung_workers_->hung_stacks(pid); };
  hooks.worker_dir = [this](int local_rank) { return worker_dir(local_rank); };
  return std::make_unique<NodeStacks>(io_, *workers_, options_.flight_recorder, python_helper_dir_,
                                      std::move(hooks));
}

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
  hooks.answer = [this]() -> Task<rdzv::Json> {
    co_return co_await stacks_->take(machine_->round());
  };
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
