// A small decoder-only transformer language model over bytes (GPT-2's layout: pre-norm blocks
// of causal self-attention and a GELU MLP, learned positions), for the gpt trainer.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "ctrun/worker/sharded.h"

namespace ctrun::trainers {

struct GptConfig {
  int64_t vocab = 256;  // bytes
  int64_t context = 64;
  int64_t width = 256;
  int64_t layers = 4;
  int64_t heads = 4;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::Linear qkv_{nullptr}, projection_{nullptr};
  torch::Tensor causal_mask_;
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::LayerNorm attention_norm_{nullptr}, mlp_norm_{nullptr};
  CausalSelfAttention attention_{nullptr};
  torch::nn::Linear mlp_in_{nullptr}, mlp_out_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptConfig& config);
  // tokens [batch, time] (int64) -> logits [batch, time, vocab]
  torch::Tensor forward(const torch::Tensor& tokens);

  const std::vector<Block>& blocks() const { return blocks_; }
  // Each block's forward through `forward` (ShardedDataParallel::unit_forward at --zero 3).
  void set_unit_forward(worker::UnitForward forward) { unit_forward_ = std::move(forward); }

 private:
  torch::nn::Embedding token_embedding_{nullptr}, position_embedding_{nullptr};
  std::vector<Block> blocks_;
  worker::UnitForward unit_forward_;
  torch::nn::LayerNorm final_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace ctrun::trainers
