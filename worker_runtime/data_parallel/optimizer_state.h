// The state torch's Adam, AdamW and SGD keep for one parameter, field by field: what the
// checkpoints move between parameters of different layouts (a whole tensor and a unit's shard).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace ctrun::worker {

struct ParamState {
  std::int64_t step = 0;                                   // Adam and AdamW; SGD has none
  std::vector<std::pair<std::string, at::Tensor>> fields;  // e.g. exp_avg, exp_avg_sq
};

// The key a torch optimizer's state map (`StateMap`, its state() type) keeps `param`'s state
// under: the parameter's TensorImpl address, as text in torch 1.13 (what its
// c10::guts::to_string printed; that function is gone in 2.x) and the pointer itself in 2.x.
template <typename StateMap>
typename StateMap::key_type optimizer_state_key(const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << static_cast<const void*>(param.unsafeGetTensorImpl());
    return text.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// nullopt before the optimizer's first step for `param`. Throws std::invalid_argument for an
// optimizer other than torch::optim::Adam, AdamW or SGD.
std::optional<ParamState> read_param_state(const torch::optim::Optimizer& optimizer,
                                           const at::Tensor& param);
// Replaces the state for `param` (which the optimizer steps) with `state`.
void write_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                       const ParamState& state);
// A new optimizer of `like`'s kind, default options, over `params`: to read another
// checkpoint's optimizer into, whose parameters had other shapes.
std::unique_ptr<torch::optim::Optimizer> optimizer_like(const torch::optim::Optimizer& like,
                                                        std::vector<at::Tensor> params);

}  // namespace ctrun::worker
