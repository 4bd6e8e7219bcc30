#include "launcher/diagnosis/node_health.h"

#include <sys/statvfs.h>

#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <utility>

#include "launcher/cli/text.h"
#include "launcher/diagnosis/nvml_reader.h"
#include "launcher/workers/captured_run.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// The free space where `dir` is or will be: a directory made later (the log directory before
// the first workers) is on its nearest existing parent's filesystem.
std::optional<std::uint64_t> free_bytes(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path at = std::filesystem::absolute(dir, ec);
  if (ec) return std::nullopt;
  while (true) {
    struct statvfs fs {};
    if (::statvfs(at.c_str(), &fs) == 0) {
      return static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    }
    if (errno != ENOENT || !at.has_relative_path()) return std::nullopt;
    at = at.parent_path();
  }
}

rdzv::Task<void> pause(asio::any_io_executor executor, rdzv::Duration d) {
  asio::steady_timer t(executor, d);
  co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
}

}  // namespace

NodeHealth::NodeHealth(asio::any_io_executor executor, HealthSettings settings, std::string host,
                       Hooks hooks)
    : executor_(std::move(executor)),
      settings_(std::move(settings)),
      host_(std::move(host)),
      hooks_(std::move(hooks)) {}

void NodeHealth::workers_stopped(const std::vector<int>& pids) {
  for (int pid : pids) {
    if (pid > 0) stopped_.push_back(pid);
  }
}

rdzv::Task<std::vector<HealthProblem>> NodeHealth::check() {
  std::vector<HealthProblem> problems;
  if (settings_.min_free_bytes > 0) {
    for (const auto& dir : settings_.dirs) {
      if (auto p = free_space_problem(dir, free_bytes(dir), settings_.min_free_bytes)) {
        problems.push_back(*p);
      }
    }
  }
  if (auto gpus = read_gpus()) {
    for (auto& p : gpu_problems(*gpus)) problems.push_back(std::move(p));
  }
  if (!settings_.command.empty()) {
    // Named before the co_await: g++ 12 mishandles temporaries inside its operand.
    const std::string shell = "/bin/sh";
    const std::vector<std::string> args{"-c", settings_.command};
    const CapturedRun run =
        co_await run_captured(executor_, shell, args, settings_.command_timeout, 64 * 1024);
    // Its output in the log, as it said it.
    std::istringstream lines(run.started ? run.text : "");
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) hooks_.log("health check: " + line);
    }
    if (auto p = command_problem(settings_.command, run.started, run.succeeded, run.timed_out,
                                 run.text)) {
      problems.push_back(*p);
    }
  }
  co_return problems;
}

rdzv::Task<void> NodeHealth::await_gpu_release(std::vector<int> stopped) {
  const auto began = std::chrono::steady_clock::now();
  while (true) {
    auto gpus = read_gpus();
    if (!gpus) co_return;  // no NVML: nothing to wait for
    const auto held = gpu_memory_held(*gpus, stopped);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    if (held.empty()) {
      if (waited >= 0.5) {
        hooks_.log("the GPU memory of the stopped workers was released after " +
                   number_text(waited, "%.1f s"));
      }
      co_return;
    }
    if (std::chrono::steady_clock::now() - began >= settings_.gpu_release_timeout) {
      std::string pids;
      for (unsigned pid : held) pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
      hooks_.log("warning: the GPU memory of stopped workers (pids " + pids +
                 ") is still held after " +
                 number_text(std::chrono::duration<double>(settings_.gpu_release_timeout).count(),
                             "%g s") +
                 "; starting the next workers anyway");
      hooks_.event("gpu_memory_held", {{"pids", held}});
      co_return;
    }
    co_await pause(executor_, std::chrono::milliseconds(200));
  }
}

rdzv::Task<rdzv::Status> NodeHealth::wait_until_healthy(rdzv::Duration limit) {
  if (!stopped_.empty()) co_await await_gpu_release(std::exchange(stopped_, {}));
  const auto began = std::chrono::steady_clock::now();
  const std::string again =
      number_text(std::chrono::duration<double>(settings_.interval).count(), "%g s");
  bool failed_before = false;
  while (true) {
    const std::vector<HealthProblem> problems = co_await check();
    if (problems.empty()) {
      unhealthy_.clear();
      if (failed_before) {
        hooks_.log("node " + host_ + " is healthy again: joining");
        hooks_.event("health_check_passed", rdzv::Json::object());
      }
      co_return rdzv::ok_status();
    }
    const std::string why = describe_problems(problems);
    unhealthy_ = why;
    rdzv::Json checks = rdzv::Json::array();
    for (const auto& p : problems) checks.push_back(p.check);
    hooks_.event("health_check_failed", {{"reason", why}, {"checks", checks}});
    if (std::chrono::steady_clock::now() - began + settings_.interval > limit) {
      co_return rdzv::Error{rdzv::ErrorCode::kTimeout,
                            "node " + host_ + " stayed unhealthy for the join timeout (" +
                                std::to_string(rdzv::to_millis(limit) / 1000) + " s): " + why};
    }
    hooks_.log("node " + host_ + " is unhealthy, not joining: " + why + "; checking again in " +
               again);
    failed_before = true;
    co_await pause(executor_, settings_.interval);
  }
}

}  // namespace ctrun::launcher
