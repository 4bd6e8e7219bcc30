// DistributedDataParallel for torch::nn::Module: what torch.nn.parallel.DistributedDataParallel
// does for Python, for C++ trainers.
//
// At construction every parameter and buffer is broadcast from rank 0 (unless
// DdpOptions::broadcast_parameters is off). Gradients are grouped
// into buckets in reverse registration order (backward produces the last layers' gradients
// first); the first bucket is small so communication starts early. A hook on each parameter's
// gradient accumulator marks it ready; when a bucket's last gradient is ready its all-reduce
// starts at once, on the collective library's threads, while backward goes on. Buckets start in
// index order on every rank, so all ranks issue the same collectives in the same order. When
// backward ends, every all-reduce is waited for and the averaged gradients are in .grad, before
// the optimizer step. After each step the parameters are bit-identical on all ranks.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ctrun/worker/process_group.h"
#include "ctrun/worker/torch_forward.h"

namespace ctrun::worker {

struct DdpOptions {
  std::size_t first_bucket_bytes = 1u << 20;  // torch's 1 MB
  std::size_t bucket_bytes = 25u << 20;       // torch's bucket_cap_mb = 25
  // Parameters that get no gradient in a backward contribute zeros instead of raising an error.
  bool find_unused_parameters = false;
  // false: no bucketed overlap; one all-reduce of all gradients after backward (for measuring
  // what overlap gains).
  bool overlap = true;
  // false: the parameters are not broadcast from rank 0 at construction (a fault-tolerant
  // replica's come from its peers when it heals; its construction must not wait for them).
  bool broadcast_parameters = true;
  // Called (on the backward thread) as each bucket's all-reduce starts: for tests and profiling.
  std::function<void(std::size_t bucket)> on_bucket_start;
};

struct DdpBucket {
  std::vector<std::size_t> parameters;  // indices into module->parameters()
  std::size_t bytes = 0;
};

class DistributedDataParallel {
 public:
  // Keeps `group` by reference: it must outlive this object.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const std::vector<DdpBucket>& buckets() const;

  // While a NoSync lives, backward only accumulates gradients locally (gradient accumulation
  // micro-steps); the next backward outside it all-reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Broadcasts buffers (e.g. running statistics) from rank 0 again.
  void broadcast_buffers();

 private:
  class Reducer;
  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroup& group_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace ctrun::worker
