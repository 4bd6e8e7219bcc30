// This node's answer to the job's dump requests (hang reports, docs/faults.md): each running
// worker's stacks and last step. Python workers all at once, by the signal on which their
// sitecustomize.py has faulthandler write every thread's stack to their stacks file while they
// run on; native stacks (C++ workers) with eu-stack, one at a time (one tracer per process); a
// worker the watchdog is killing as hung gives the stacks it took for that. With
// --flight_recorder, what each worker's NCCL Flight Recorder dump says too (ctrun_worker.py's
// fr_summary reads it).
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/round.h"
#include "ctrun/rendezvous/task.h"
#include "launcher/diagnosis/hang_report.h"
#include "launcher/workers/worker_runner.h"

namespace ctrun::launcher {

class NodeStacks {
 public:
  struct Hooks {
    std::function<void(const std::string& line)> log;
    // The step local rank `local_rank`'s worker last reported, if any.
    std::function<std::optional<std::int64_t>(int local_rank)> step;
    // The native stacks of worker `pid` if the watchdog found it hung ("" while being taken).
    std::function<std::optional<std::string>(int pid)> hung_stacks;
    // Where that worker keeps its files (its Flight Recorder dumps are there).
    std::function<std::string(int local_rank)> worker_dir;
  };

  // `python_helper_dir`: where ctrun_worker.py is (the Flight Recorder's reader).
  NodeStacks(boost::asio::io_context& io, WorkerRunner& workers, bool flight_recorder,
             std::string python_helper_dir, Hooks hooks);

  // The signal on which a Python worker's faulthandler writes its stacks (sitecustomize.py).
  static int signal();
  // The Flight Recorder's dump files' prefix (TORCH_NCCL_DEBUG_INFO_TEMP_FILE) in a worker's
  // directory.
  static std::string flight_recorder_prefix(const std::string& worker_dir) {
    return worker_dir + "/nccl_trace_";
  }
  // A new group of workers; then each Python worker's stacks file (CTRUN_STACKS_FILE), which
  // it makes once its handler is registered (before that the signal would end it).
  void reset(int local_world_size) {
    stacks_files_.assign(static_cast<std::size_t>(local_world_size), "");
  }
  void set_stacks_file(int local_rank, std::string path);

  // The answer for the round the workers run in: {"node", "nodes", "host", "ranks", "flight"}.
  rendezvous::Task<rendezvous::Json> take(rendezvous::RoundAssignment round);

 private:
  rendezvous::Task<std::optional<FlightRecord>> read_flight_record(int local_rank, int rank);

  boost::asio::io_context& io_;
  WorkerRunner& workers_;
  bool flight_recorder_;
  std::string python_helper_dir_;
  Hooks hooks_;
  std::vector<std::string> stacks_files_;  // by local rank; "" none
};

}  // namespace ctrun::launcher
