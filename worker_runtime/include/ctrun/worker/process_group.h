// The process group a worker trains in: collectives over Gloo (CPU tensors) or NCCL (CUDA
// tensors), bootstrapped through the store the launcher advertises (docs/worker_runtime.md).
// A collective that fails, or that waits on a dead peer longer than the timeout, throws
// CollectiveError: a lost peer ends the step with an exception, never a hang.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ctrun/worker/env.h"

namespace ctrun::worker {

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Backend { kGloo, kNccl };
// "gloo" or "nccl"; throws std::invalid_argument naming the value otherwise.
Backend parse_backend(const std::string& name);
const char* backend_name(Backend backend);
// Whether this build has the NCCL backend (CUDA, NCCL and a CUDA LibTorch were found).
bool nccl_available();

// An asynchronous collective; wait() throws CollectiveError when it failed or timed out.
// Gloo's wait() returns when the result is there. NCCL's returns at once: it orders the
// caller's later kernels (on the default stream) after the collective, on the GPU, and a
// failure or timeout its watchdog finds later is thrown by the group's next call.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

struct ProcessGroupOptions {
  Backend backend = Backend::kGloo;
  // How long a collective (and the bootstrap) may wait for the slowest peer.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual Backend backend() const = 0;

  // Sums `tensor` in place over all ranks.
  virtual std::unique_ptr<Work> all_reduce_async(at::Tensor tensor) = 0;
  void all_reduce(at::Tensor tensor) { all_reduce_async(std::move(tensor))->wait(); }
  // Reduce-scatter: sums `input` (1-D, size() equal chunks) over all ranks and leaves chunk
  // rank() of the sum in `output` (1-D, input.numel() / size() elements). A sharded model's
  // gradients, many tensors flattened into one buffer: one collective for all of them.
  virtual std::unique_ptr<Work> reduce_scatter_async(at::Tensor output, at::Tensor input) = 0;
  // All-gather into one buffer: every rank's `input` (1-D, same numel), by rank, into `output`
  // (1-D, size() * input.numel()). `input` may be this rank's chunk of `output` (in place).
  virtual std::unique_ptr<Work> all_gather_into_async(at::Tensor output, at::Tensor input) = 0;
  // Copies `tensor` of rank `root` into every rank's `tensor`.
  virtual void broadcast(at::Tensor tensor, int root) = 0;
  // Every rank's `tensor` (same shape on all ranks), by rank.
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& tensor) = 0;
  virtual void barrier() = 0;
  // Point to point: `tensor` to rank `dst`; into `tensor` (allocated, of the sent size) from
  // rank `src`. Messages between two ranks arrive in the order sent.
  virtual void send(const at::Tensor& tensor, int dst) = 0;
  virtual void recv(at::Tensor tensor, int src) = 0;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}
  // Throws std::invalid_argument naming `op` unless `whole` and `chunk` are 1-D, of one dtype
  // and device, and `whole` holds size() chunks.
  void check_chunks(const char* op, const at::Tensor& whole, const at::Tensor& chunk) const;
  // For a group whose membership changes under it (the fault-tolerant group).
  void set_rank_and_size(int rank, int size) {
    rank_ = rank;
    size_ = size;
  }

 private:
  int rank_;
  int size_;
};

// Joins the world `env` describes: through the daemon's store under the round's prefix when
// ctrun advertises one (CTRUN_STORE_*), through a TCPStore at MASTER_ADDR:MASTER_PORT under
// torchrun, or alone (world size 1) with no launcher.
std::unique_ptr<ProcessGroup> init_process_group(const WorkerEnv& env,
                                                 const ProcessGroupOptions& options = {});

}  // namespace ctrun::worker
