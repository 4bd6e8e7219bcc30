#include "gpt_model.h"

#include <torch/nn/functional/activation.h>

#include <cmath>

namespace ctrun::trainers {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& c) : heads_(c.heads) {
  qkv_ = register_module("qkv", torch::nn::Linear(c.width, 3 * c.width));
  projection_ = register_module("projection", torch::nn::Linear(c.width, c.width));
  // Position t attends to positions <= t. A buffer: it moves with the module to the device.
  causal_mask_ = register_buffer(
      "causal_mask", torch::ones({c.context, c.context}, torch::kBool).tril().logical_not());
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
  const int64_t head_width = width / heads_;
  auto qkv = qkv_->forward(x).split(width, 2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({batch, time, heads_, head_width}).transpose(1, 2);
  };
  const torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  auto scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_width));
  scores = scores.masked_fill(causal_mask_.slice(0, 0, time).slice(1, 0, time),
                              -std::numeric_limits<float>::infinity());
  auto y = scores.softmax(-1).matmul(v).transpose(1, 2).contiguous().view({batch, time, width});
  return projection_->forward(y);
}

BlockImpl::BlockImpl(const GptConfig& c) {
  attention_norm_ = register_module("attention_norm",
                                    torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  attention_ = register_module("attention", CausalSelfAttention(c));
  mlp_norm_ =
      register_module("mlp_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  mlp_in_ = register_module("mlp_in", torch::nn::Linear(c.width, 4 * c.width));
  mlp_out_ = register_module("mlp_out", torch::nn::Linear(4 * c.width, c.width));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attention_->forward(attention_norm_->forward(x));
  return h + mlp_out_->forward(torch::gelu(mlp_in_->forward(mlp_norm_->forward(h))));
}

GptImpl::GptImpl(const GptConfig& c) {
  token_embedding_ = register_module("token_embedding", torch::nn::Embedding(c.vocab, c.width));
  position_embedding_ =
      register_module("position_embedding", torch::nn::Embedding(c.context, c.width));
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(register_module("block" + std::to_string(i), Block(c)));
  }
  final_norm_ =
      register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})));
  head_ = register_module("head", torch::nn::Linear(c.width, c.vocab));
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  const int64_t time = tokens.size(1);
  auto positions = torch::arange(time, tokens.options().dtype(torch::kLong));
  auto x = token_embedding_->forward(tokens) + position_embedding_->forward(positions);
  for (auto& block : blocks_) {
    if (unit_forward_) {
      x = unit_forward_(*block, [&] { return block->forward(x); });
    } else {
      x = block->forward(x);
    }
  }
  return head_->forward(final_norm_->forward(x));
}

}  // namespace ctrun::trainers
