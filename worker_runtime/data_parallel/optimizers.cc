#include "ctrun/worker/optimizers.h"

#include "worker_runtime/data_parallel/optimizer_state.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <stdexcept>

namespace ctrun::worker {
namespace {

#define CTRUN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// What one step of one parameter group needs, whichever kernel runs it.
struct AdamGroup {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<int64_t> steps;  // after this step
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false;
  bool decoupled = false;  // AdamW: weight decay on the parameter, not added to the gradient
};

// The group's parameters that have a gradient, their state (created on the first step, as
// torch does) and their step counts, advanced.
template <typename State, typename Options, typename StateMap>
AdamGroup collect(torch::optim::OptimizerParamGroup& group, StateMap& states, bool decoupled) {
  const auto& options = static_cast<const Options&>(group.options());
  AdamGroup g;
  g.lr = options.lr();
  g.beta1 = std::get<0>(options.betas());
  g.beta2 = std::get<1>(options.betas());
  g.eps = options.eps();
  g.weight_decay = options.weight_decay();
  g.amsgrad = options.amsgrad();
  g.decoupled = decoupled;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    if (p.grad().is_sparse()) throw std::invalid_argument("Adam: sparse gradients");
    const auto key = optimizer_state_key<std::decay_t<StateMap>>(p);
    auto found = states.find(key);
    if (found == states.end()) {
      auto state = std::make_unique<State>();
      state->step(0);
      state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (g.amsgrad) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      found = states.emplace(key, std::move(state)).first;
    }
    auto& state = static_cast<State&>(*found->second);
    state.step(state.step() + 1);
    g.params.push_back(p);
    g.grads.push_back(p.grad());
    g.exp_avgs.push_back(state.exp_avg());
    g.exp_avg_sqs.push_back(state.exp_avg_sq());
    if (g.amsgrad) g.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
    g.steps.push_back(state.step());
  }
  return g;
}

// torch's per-parameter step (adam.cpp, adamw.cpp), its operations one call each for all.
void step_foreach(AdamGroup& g) {
  if (g.params.empty()) return;
  std::vector<at::Tensor> grads = g.grads;
  if (g.weight_decay != 0) {
    if (g.decoupled) {
      at::_foreach_mul_(g.params, 1 - g.lr * g.weight_decay);
    } else {
      grads = at::_foreach_add(grads, g.params, g.weight_decay);
    }
  }
  at::_foreach_mul_(g.exp_avgs, g.beta1);
  at::_foreach_add_(g.exp_avgs, grads, 1 - g.beta1);
  at::_foreach_mul_(g.exp_avg_sqs, g.beta2);
  at::_foreach_addcmul_(g.exp_avg_sqs, grads, grads, 1 - g.beta2);
  std::vector<at::Scalar> sqrt_corrections, step_sizes;
  for (int64_t step : g.steps) {
    const double correction1 = 1 - std::pow(g.beta1, static_cast<double>(step));
    const double correction2 = 1 - std::pow(g.beta2, static_cast<double>(step));
    sqrt_corrections.emplace_back(std::sqrt(correction2));
    step_sizes.emplace_back(-(g.lr / correction1));
  }
  std::vector<at::Tensor> denoms;
  if (g.amsgrad) {
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      at::max_out(g.max_exp_avg_sqs[i], g.exp_avg_sqs[i], g.max_exp_avg_sqs[i]);
    }
    denoms = at::_foreach_sqrt(g.max_exp_avg_sqs);
  } else {
    denoms = at::_foreach_sqrt(g.exp_avg_sqs);
  }
  at::_foreach_div_(denoms, sqrt_corrections);
  at::_foreach_add_(denoms, g.eps);
  at::_foreach_addcdiv_(g.params, g.exp_avgs, denoms, step_sizes);
}

bool same_device_and_type(const AdamGroup& g) {
  for (const auto& p : g.params) {
    if (p.device() != g.params[0].device() || p.scalar_type() != g.params[0].scalar_type()) {
      return false;
    }
  }
  return true;
}

void step_fused(AdamGroup& g) {
  if (g.params.empty()) return;
#if CTRUN_TORCH_AT_LEAST(2, 0)
  if (!same_device_and_type(g)) {
    step_foreach(g);  // the fused kernels take one device and type per call
    return;
  }
  // The fused kernels read the step count from tensors (already advanced, as torch's Python
  // optimizer passes them).
  std::vector<at::Tensor> steps;
  for (int64_t step : g.steps) {
    steps.push_back(
        at::full({}, static_cast<double>(step), g.params[0].options().dtype(at::kFloat)));
  }
  if (g.decoupled) {
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, steps, g.lr,
                      g.beta1, g.beta2, g.weight_decay, g.eps, g.amsgrad, /*maximize=*/false);
  } else {
    at::_fused_adam_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, g.max_exp_avg_sqs, steps, g.lr,
                     g.beta1, g.beta2, g.weight_decay, g.eps, g.amsgrad, /*maximize=*/false);
  }
#else
  (void)same_device_and_type;
  throw std::logic_error("fused Adam kernels are not in this LibTorch");
#endif
}

// kAuto resolved for the parameters, kFused checked.
OptimizerKernel resolve(OptimizerKernel kernel, const std::vector<at::Tensor>& params) {
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params[0].device();
  if (kernel == OptimizerKernel::kAuto) {
    return fused_adam_available(device) ? OptimizerKernel::kFused : OptimizerKernel::kForeach;
  }
  if (kernel == OptimizerKernel::kFused && !fused_adam_available(device)) {
    throw std::invalid_argument("optimizer kernel 'fused': this LibTorch (" TORCH_VERSION
                                ") has no fused Adam kernel for " +
                                device.str() + "; use foreach or loop");
  }
  return kernel;
}

template <typename State, typename Options, typename Optimizer>
at::Tensor multi_tensor_step(Optimizer& optimizer, OptimizerKernel kernel, bool decoupled,
                             const torch::optim::Optimizer::LossClosure& closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : optimizer.param_groups()) {
    AdamGroup g = collect<State, Options>(group, optimizer.state(), decoupled);
    if (kernel == OptimizerKernel::kFused) {
      step_fused(g);
    } else {
      step_foreach(g);
    }
  }
  return loss;
}

}  // namespace

OptimizerKernel parse_optimizer_kernel(const std::string& name) {
  if (name == "auto") return OptimizerKernel::kAuto;
  if (name == "fused") return OptimizerKernel::kFused;
  if (name == "foreach") return OptimizerKernel::kForeach;
  if (name == "loop") return OptimizerKernel::kLoop;
  throw std::invalid_argument("optimizer kernel: expected auto, fused, foreach or loop, got '" +
                              name + "'");
}

const char* optimizer_kernel_name(OptimizerKernel kernel) {
  switch (kernel) {
    case OptimizerKernel::kAuto:
      return "auto";
    case OptimizerKernel::kFused:
      return "fused";
    case OptimizerKernel::kForeach:
      return "foreach";
    case OptimizerKernel::kLoop:
      return "loop";
  }
  return "?";
}

bool fused_adam_available(const c10::Device& device) {
#if CTRUN_TORCH_AT_LEAST(2, 4)
  return device.is_cuda() || device.is_cpu();
#elif CTRUN_TORCH_AT_LEAST(2, 0)
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

Adam::Adam(std::vector<at::Tensor> params, torch::optim::AdamOptions options,
           OptimizerKernel kernel)
    : torch::optim::Adam(params, options), kernel_(resolve(kernel, params)) {}

at::Tensor Adam::step(LossClosure closure) {
  if (kernel_ == OptimizerKernel::kLoop) return torch::optim::Adam::step(std::move(closure));
  return multi_tensor_step<torch::optim::AdamParamState, torch::optim::AdamOptions>(
      *this, kernel_, /*decoupled=*/false, closure);
}

AdamW::AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions options,
             OptimizerKernel kernel)
    : torch::optim::AdamW(params, options), kernel_(resolve(kernel, params)) {}

at::Tensor AdamW::step(LossClosure closure) {
  if (kernel_ == OptimizerKernel::kLoop) return torch::optim::AdamW::step(std::move(closure));
  return multi_tensor_step<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(
      *this, kernel_, /*decoupled=*/true, closure);
}

}  // namespace ctrun::worker
