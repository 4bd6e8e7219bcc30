#include "worker_runtime/data_parallel/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>
#include <type_traits>

namespace ctrun::worker {
namespace {

template <typename State>
auto state_key(State&, const at::Tensor& param) {
  return optimizer_state_key<std::decay_t<State>>(param);
}

[[noreturn]] void unsupported() {
  throw std::invalid_argument(
      "checkpoint: the optimizer must be torch::optim::Adam, AdamW or SGD to be resharded");
}

template <typename AdamState>
ParamState read_adam(const AdamState& s) {
  ParamState out;
  out.step = s.step();
  out.fields = {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};
  if (s.max_exp_avg_sq().defined()) out.fields.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
  return out;
}

template <typename AdamState>
std::unique_ptr<AdamState> write_adam(const ParamState& state) {
  auto s = std::make_unique<AdamState>();
  s->step(state.step);
  for (const auto& [name, tensor] : state.fields) {
    if (name == "exp_avg") {
      s->exp_avg(tensor);
    } else if (name == "exp_avg_sq") {
      s->exp_avg_sq(tensor);
    } else if (name == "max_exp_avg_sq") {
      s->max_exp_avg_sq(tensor);
    } else {
      throw std::invalid_argument("checkpoint: Adam keeps no '" + name + "'");
    }
  }
  if (!s->exp_avg().defined() || !s->exp_avg_sq().defined()) {
    throw std::invalid_argument("checkpoint: Adam's state needs exp_avg and exp_avg_sq");
  }
  return s;
}

}  // namespace

std::optional<ParamState> read_param_state(const torch::optim::Optimizer& optimizer,
                                           const at::Tensor& param) {
  const auto& state = optimizer.state();
  const bool adam = dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr;
  const bool adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr;
  const bool sgd = dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr;
  if (!adam && !adamw && !sgd) unsupported();
  const auto found = state.find(state_key(state, param));
  if (found == state.end()) return std::nullopt;
  if (adam) return read_adam(static_cast<const torch::optim::AdamParamState&>(*found->second));
  if (adamw) return read_adam(static_cast<const torch::optim::AdamWParamState&>(*found->second));
  const auto& s = static_cast<const torch::optim::SGDParamState&>(*found->second);
  ParamState out;
  if (s.momentum_buffer().defined()) out.fields = {{"momentum_buffer", s.momentum_buffer()}};
  return out;
}

void write_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamState& state) {
  auto& states = optimizer.state();
  auto key = state_key(states, param);
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    states[key] = write_adam<torch::optim::AdamParamState>(state);
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    states[key] = write_adam<torch::optim::AdamWParamState>(state);
  } else if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    for (const auto& [name, tensor] : state.fields) {
      if (name != "momentum_buffer") {
        throw std::invalid_argument("checkpoint: SGD keeps no '" + name + "'");
      }
      s->momentum_buffer(tensor);
    }
    states[key] = std::move(s);
  } else {
    unsupported();
  }
}

std::unique_ptr<torch::optim::Optimizer> optimizer_like(const torch::optim::Optimizer& like,
                                                        std::vector<at::Tensor> params) {
  if (dynamic_cast<const torch::optim::Adam*>(&like) != nullptr) {
    return std::make_unique<torch::optim::Adam>(std::move(params));
  }
  if (dynamic_cast<const torch::optim::AdamW*>(&like) != nullptr) {
    return std::make_unique<torch::optim::AdamW>(std::move(params));
  }
  if (dynamic_cast<const torch::optim::SGD*>(&like) != nullptr) {
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(1e-3));
  }
  unsupported();
}

}  // namespace ctrun::worker
