// torch's Adam and AdamW, stepped through LibTorch's multi-tensor kernels: `_fused_adam(w)_`
// where the LibTorch has them for the parameters' device (CUDA from torch 2.0, CPU from 2.4),
// the `_foreach_` kernels otherwise, or torch's own per-parameter loop. Each is a subclass of
// torch::optim::Adam/AdamW with torch's options and per-parameter state, so checkpoints
// (whole and sharded) and everything else that knows torch's optimizers take them as they are.
// The foreach path runs torch's elementwise operations in torch's order: the same numbers as
// the loop. The fused kernels compute in one pass: equal within float rounding.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <string>
#include <vector>

namespace ctrun::worker {

enum class OptimizerKernel {
  kAuto,     // fused where available for the parameters' device, else foreach
  kFused,    // _fused_adam(w)_; an error where this LibTorch has none for the device
  kForeach,  // the _foreach_ kernels (one call per operation for all parameters)
  kLoop,     // torch's step: one kernel per operation per parameter
};

// "auto", "fused", "foreach" or "loop"; throws std::invalid_argument naming the value.
OptimizerKernel parse_optimizer_kernel(const std::string& name);
const char* optimizer_kernel_name(OptimizerKernel kernel);
// Whether this LibTorch has fused Adam kernels for tensors on `device`.
bool fused_adam_available(const c10::Device& device);

class Adam : public torch::optim::Adam {
 public:
  // Throws std::invalid_argument when `kernel` is kFused and there is no fused kernel for the
  // parameters' device.
  Adam(std::vector<at::Tensor> params, torch::optim::AdamOptions options = {},
       OptimizerKernel kernel = OptimizerKernel::kAuto);
  at::Tensor step(LossClosure closure = nullptr) override;
  OptimizerKernel kernel() const { return kernel_; }  // as resolved (never kAuto)

 private:
  OptimizerKernel kernel_;
};

class AdamW : public torch::optim::AdamW {
 public:
  AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions options = {},
        OptimizerKernel kernel = OptimizerKernel::kAuto);
  at::Tensor step(LossClosure closure = nullptr) override;
  OptimizerKernel kernel() const { return kernel_; }

 private:
  OptimizerKernel kernel_;
};

}  // namespace ctrun::worker
