// Progress beats from a worker to its agent. Under `ctrun --worker_timeout=S` every worker gets
// CTRUN_HEARTBEAT_FILE; a beat sets that file's modification time, and the agent kills a worker
// whose file has not changed for S seconds (after its first beat). DDP beats once per step, so a
// trainer built on it needs no code; any other program (a Python script too) may touch the file.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace ctrun::worker {

// Beats through CTRUN_HEARTBEAT_FILE when it is set; otherwise does nothing. Thread-safe and
// cheap: a clock read, and at most one file update per 100 ms.
void heartbeat();

// The worker's training step, for `ctrun --faults` plans that fire at a step (docs/faults.md):
// written into CTRUN_HEARTBEAT_FILE as text, which is a beat too. A trainer calls it once per
// step with its own count (a resumed run goes on from its checkpoint's step); FaultTolerance
// reports its committed step itself. From Python: ctrun_worker.report_step(step), the helper
// ctrun puts on the workers' PYTHONPATH. Does nothing without the variable.
// Where a plan injects a fault into this worker (CTRUN_FAULT_FILE exists), instead, before the
// step is reported: throws InjectedFault (kind "exception"), or makes a CUDA error (kind
// "cuda_error") with the maker below, whose error propagates; without a maker, InjectedFault
// saying this worker has no CUDA device.
void report_step(std::int64_t step);

// Time a thread of this process spent blocked on its peers in a collective (libctrun_worker's
// Gloo group calls it from each wait): from the first one on, report_step writes the total
// beside the step, and the agents tell each rank's own time in a step from the time it waited
// for the others (the straggler verdict of a synchronous job, docs/cluster.md). Thread-safe.
void add_collective_wait(std::chrono::nanoseconds waited);

// An exception a `ctrun --faults` plan raised in this worker (kind "exception").
class InjectedFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What makes a planned CUDA error in this process: a kernel that fails on the GPU it trains on,
// throwing what LibTorch throws for it (`message` says which fault). libctrun_worker's NCCL
// process group sets it for its device; an empty one unsets it.
using CudaErrorMaker = std::function<void(const std::string& message)>;
void set_cuda_error_maker(CudaErrorMaker maker);

// One heartbeat file; what heartbeat() uses, separate so it is tested without the environment.
class HeartbeatFile {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HeartbeatFile(std::string path,
                         std::chrono::milliseconds min_interval = std::chrono::milliseconds(100))
      : path_(std::move(path)), min_interval_(min_interval) {}

  // Updates the file's time unless the last update was less than min_interval before `now`.
  // Returns true when it wrote; a failed write (the file's directory gone) is not retried sooner.
  bool beat(Clock::time_point now);
  // Writes `step` as the file's text, then the nanoseconds waited in collectives so far where
  // known ("12 3400000", padded with blanks to kRecordWidth, then a newline; the agent created
  // the file: never created here).
  static constexpr std::size_t kRecordWidth = 41;
  bool write_step(std::int64_t step, std::optional<std::int64_t> waited_ns = std::nullopt);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::chrono::milliseconds min_interval_;
  Clock::time_point last_{};
  bool beaten_ = false;
};

}  // namespace ctrun::worker
