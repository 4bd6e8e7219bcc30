// The multi-tensor Adam and AdamW against torch's own: the same numbers over many steps, with
// and without weight decay and AMSGrad, and the same state (so checkpoints take either).
#include "ctrun/worker/optimizers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "catch.h"

using ctrun::worker::OptimizerKernel;

namespace {

std::vector<torch::Tensor> make_params() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<torch::Tensor> params;
  for (auto shape : std::vector<std::vector<int64_t>>{{33, 17}, {17}, {4, 5, 6}, {1}}) {
    params.push_back(at::randn(shape, generator).requires_grad_(true));
  }
  return params;
}

// Steps `optimizer` over `params` with the same gradients every run (one parameter gets none
// at odd steps: its state must not advance then).
void train(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor>& params) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int step = 0; step < 12; ++step) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto grad = at::randn(params[i].sizes(), generator);
      if (i == 2 && step % 2 == 1) {
        params[i].mutable_grad() = torch::Tensor();
      } else {
        params[i].mutable_grad() = grad;
      }
    }
    optimizer.step();
  }
}

template <typename Reference, typename Ours, typename Options>
void check_same(const Options& options, OptimizerKernel kernel) {
  auto expected = make_params();
  Reference reference(expected, options);
  train(reference, expected);
  auto got = make_params();
  Ours ours(got, options, kernel);
  train(ours, got);
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i);
    const double diff = (got[i] - expected[i]).abs().max().item<double>();
    CHECK(diff <= (kernel == OptimizerKernel::kFused ? 1e-6 : 0.0));
    const auto& state = ours.state();
    CHECK(state.size() == reference.state().size());
  }
  // Training moved them (the comparison above is not trivial).
  CHECK((got[0] - make_params()[0]).abs().max().item<double>() > 1e-3);
}

}  // namespace

TEST_CASE("optimizers: foreach and loop Adam and AdamW give torch's numbers exactly") {
  for (auto kernel : {OptimizerKernel::kForeach, OptimizerKernel::kLoop}) {
    INFO(ctrun::worker::optimizer_kernel_name(kernel));
    check_same<torch::optim::AdamW, ctrun::worker::AdamW>(
        torch::optim::AdamWOptions(0.01).weight_decay(0.1), kernel);
    check_same<torch::optim::AdamW, ctrun::worker::AdamW>(
        torch::optim::AdamWOptions(0.01).weight_decay(0).amsgrad(true), kernel);
    check_same<torch::optim::Adam, ctrun::worker::Adam>(
        torch::optim::AdamOptions(0.01).weight_decay(0.05), kernel);
    check_same<torch::optim::Adam, ctrun::worker::Adam>(
        torch::optim::AdamOptions(0.02).amsgrad(true), kernel);
  }
}

TEST_CASE("optimizers: the fused kernels agree with torch's within float rounding") {
  if (!ctrun::worker::fused_adam_available(torch::kCPU)) {
    // This LibTorch has none for the CPU: asking for them is a clear error, and auto is foreach.
    auto params = make_params();
    CHECK_THROWS_WITH(ctrun::worker::AdamW(params, {}, OptimizerKernel::kFused),
                      Catch::Matchers::ContainsSubstring("no fused Adam kernel for cpu"));
    CHECK(ctrun::worker::AdamW(params).kernel() == OptimizerKernel::kForeach);
    return;
  }
  check_same<torch::optim::AdamW, ctrun::worker::AdamW>(
      torch::optim::AdamWOptions(0.01).weight_decay(0.1), OptimizerKernel::kFused);
  check_same<torch::optim::Adam, ctrun::worker::Adam>(
      torch::optim::AdamOptions(0.01).weight_decay(0.05).amsgrad(true), OptimizerKernel::kFused);
}

TEST_CASE("optimizers: kernel names") {
  CHECK(ctrun::worker::parse_optimizer_kernel("foreach") == OptimizerKernel::kForeach);
  CHECK(ctrun::worker::parse_optimizer_kernel("auto") == OptimizerKernel::kAuto);
  CHECK_THROWS_WITH(ctrun::worker::parse_optimizer_kernel("fast"),
                    "optimizer kernel: expected auto, fused, foreach or loop, got 'fast'");
}
