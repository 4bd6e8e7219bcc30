// Test helper: a small model with two residual blocks (stage 3's units) between root
// parameters, and the data the sharding tests train it on.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <utility>
#include <vector>

#include "ctrun/worker/sharded.h"

namespace ctrun::testing::sharded_net {

// A residual block, the unit stage 3 gathers at a time.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : expand(register_module("expand", torch::nn::Linear(32, 48))),
        project(register_module("project", torch::nn::Linear(48, 32))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + project(torch::tanh(expand(x))); }
  // Not "in": LibTorch's archives cannot read a module of a Python keyword's name back.
  torch::nn::Linear expand, project;
};
TORCH_MODULE(Block);

// Root parameters before and after the blocks (like an embedding and a head); the root's 709
// elements need padding at 2, 3 and 4 ranks.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : embed(register_module("embed", torch::nn::Linear(16, 32))),
        block0(register_module("block0", Block())),
        block1(register_module("block1", Block())),
        head(register_module("head", torch::nn::Linear(32, 5))) {}
  // In the parameters' type (bf16 with mixed precision), the output in float.
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = embed(x.to(embed->weight.scalar_type()));
    for (auto* block : {&block0, &block1}) {
      h = run_unit ? run_unit(**block, [&] { return (*block)(h); }) : (*block)(h);
    }
    return head(torch::tanh(h)).to(torch::kFloat);
  }
  torch::nn::Linear embed;
  Block block0, block1;
  torch::nn::Linear head;
  worker::UnitForward run_unit;
};
TORCH_MODULE(Net);

inline Net make_model(std::uint64_t init_seed) {
  Net model;
  // A private generator: ranks are threads, and the global one is shared.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(init_seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), generator) * 0.3);
  return model;
}

inline std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int rows) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return {at::randn({rows, 16}, generator), at::randn({rows, 5}, generator)};
}

inline torch::Tensor flat_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().reshape(-1).clone());
  return torch::cat(flat);
}

}  // namespace ctrun::testing::sharded_net
