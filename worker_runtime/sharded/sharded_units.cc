#include "worker_runtime/sharded/sharded_units.h"

#include <stdexcept>
#include <unordered_map>

namespace ctrun::worker::sharding {

at::Tensor alias(const at::Tensor& base, int64_t offset, int64_t numel) {
  at::Tensor t = at::empty({0}, base.options());
  t.set_(base.storage(), base.storage_offset() + offset, {numel}, {1});
  return t;
}

void release_memory(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void restore_memory(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const std::size_t bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

TrainedParameters trained_parameters(torch::nn::Module& module) {
  TrainedParameters out;
  std::vector<at::Tensor>& params = out.params;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen: stays whole on every rank
    if (!params.empty() &&
        (p.scalar_type() != params[0].scalar_type() || p.device() != params[0].device())) {
      throw std::invalid_argument("ShardedDataParallel: parameter '" + item.key() + "' is " +
                                  c10::toString(p.scalar_type()) + " on " + p.device().str() +
                                  ", the first one " + c10::toString(params[0].scalar_type()) +
                                  " on " + params[0].device().str() +
                                  "; every parameter must have one type and device");
    }
    if (!at::isFloatingType(p.scalar_type())) {
      throw std::invalid_argument("ShardedDataParallel: parameter '" + item.key() +
                                  "' is not of a floating type");
    }
    out.names.push_back(item.key());
    params.push_back(p);
  }
  if (params.empty()) {
    throw std::invalid_argument(
        "ShardedDataParallel: no parameter of the module requires a "
        "gradient");
  }
  return out;
}

Stage3Plan plan_stage3_units(const TrainedParameters& trained,
                             const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  const std::vector<at::Tensor>& params = trained.params;
  std::unordered_map<const c10::TensorImpl*, std::size_t> index;
  for (std::size_t i = 0; i < params.size(); ++i) index[params[i].unsafeGetTensorImpl()] = i;
  std::vector<bool> claimed(params.size(), false);
  Stage3Plan plan;
  for (const auto& listed : units) {
    if (!listed) throw std::invalid_argument("ShardingOptions::units: a null module");
    std::vector<std::size_t> members;
    for (const auto& p : listed->parameters()) {
      if (!p.requires_grad()) continue;
      const auto found = index.find(p.unsafeGetTensorImpl());
      if (found == index.end()) {
        throw std::invalid_argument("ShardingOptions::units: module '" + listed->name() +
                                    "' has a parameter that is not the model's");
      }
      if (claimed[found->second]) {
        throw std::invalid_argument("ShardingOptions::units: parameter '" +
                                    trained.names[found->second] + "' is in two units");
      }
      claimed[found->second] = true;
      members.push_back(found->second);
    }
    if (!members.empty()) plan.listed.emplace_back(listed.get(), std::move(members));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!claimed[i]) plan.rest.push_back(i);
  }
  return plan;
}

Unit make_unit(std::vector<at::Tensor>& params, const std::vector<std::size_t>& members, bool root,
               const UnitSettings& settings) {
  at::NoGradGuard no_grad;
  const int stage = settings.stage;
  Unit unit;
  unit.members = members;
  unit.root = root;
  std::vector<int64_t> numels;
  for (std::size_t m : members) numels.push_back(params[m].numel());
  unit.layout = make_shard_layout(numels, settings.size);
  const ShardLayout& layout = unit.layout;
  const at::TensorOptions master_options = params[members[0]].options().requires_grad(false);
  const at::TensorOptions options = master_options.dtype(settings.compute_type);
  unit.full = at::zeros({layout.padded}, options);
  // With mixed precision the values in the parameters' own type, for the master shard.
  at::Tensor master = settings.mixed ? at::zeros({layout.padded}, master_options) : unit.full;
  if (stage == 1) unit.grad_full = at::zeros({layout.padded}, options);
  for (std::size_t k = 0; k < members.size(); ++k) {
    at::Tensor& p = params[members[k]];
    at::Tensor view = alias(unit.full, layout.offsets[k], layout.numels[k]).view(p.sizes());
    view.copy_(p.detach());
    if (settings.mixed) {
      master.narrow(0, layout.offsets[k], layout.numels[k]).copy_(p.detach().view(-1));
    }
    p.set_data(view);
    unit.views.push_back(view);
    if (stage == 1) {
      p.mutable_grad() = alias(unit.grad_full, layout.offsets[k], layout.numels[k]).view(p.sizes());
    }
  }
  const int64_t begin = settings.rank * layout.shard;
  unit.shard = stage < 3 && !settings.mixed ? alias(unit.full, begin, layout.shard)
                                            : master.narrow(0, begin, layout.shard).clone();
  unit.shard.requires_grad_(true);
  if (stage == 1) unit.grad_shard = alias(unit.grad_full, begin, layout.shard);
  return unit;
}

}  // namespace ctrun::worker::sharding
