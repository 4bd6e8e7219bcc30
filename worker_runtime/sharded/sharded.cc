#include "ctrun/worker/sharded.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "ctrun/worker/heartbeat.h"
#include "worker_runtime/base/shard_layout.h"
#include "worker_runtime/process_groups/coalesced.h"
#include "worker_runtime/sharded/sharded_access.h"
#include "worker_runtime/sharded/sharded_units.h"

namespace ctrun::worker {

using sharding::alias;
using sharding::Gathered;
using sharding::release_memory;
using sharding::restore_memory;
using sharding::Unit;

class ShardedDataParallel::Engine {
 public:
  Engine(torch::nn::Module& module, ProcessGroup& group, ShardingOptions options)
      : group_(group), options_(std::move(options)) {
    if (options_.stage < 1 || options_.stage > 3) {
      throw std::invalid_argument("ShardingOptions::stage: expected 1, 2 or 3, got " +
                                  std::to_string(options_.stage));
    }
    auto trained = sharding::trained_parameters(module);
    params_ = std::move(trained.params);
    names_ = std::move(trained.names);
    unit_of_.assign(params_.size(), kNoUnit);
    compute_type_ = options_.param_dtype.value_or(params_[0].scalar_type());
    mixed_ = compute_type_ != params_[0].scalar_type();
    if (mixed_ && !at::isFloatingType(compute_type_)) {
      throw std::invalid_argument("ShardingOptions::param_dtype: not a floating type");
    }
    if (options_.broadcast_parameters) {
      std::vector<at::Tensor> state = module.parameters();
      for (const auto& buffer : module.buffers()) state.push_back(buffer);
      broadcast_coalesced(group_, state);
    }
    if (options_.stage < 3) {
      std::vector<std::size_t> bytes;
      for (const auto& p : params_) bytes.push_back(p.numel() * p.element_size());
      for (auto& members : group_into_units(bytes, options_.unit_bytes)) add_unit(members, false);
    } else {
      // One unit per listed module, in the order listed, then the root: the rest.
      auto plan = sharding::plan_stage3_units({params_, names_}, options_.units);
      for (const auto& [listed, members] : plan.listed) {
        unit_of_module_[listed] = units_.size();
        add_unit(members, false);
      }
      if (!plan.rest.empty()) {
        root_ = units_.size();
        add_unit(plan.rest, true);
      }
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      // The accumulator is what torch's own reducer hooks: its post hook runs once the
      // gradient is in .grad. The variable holds it only weakly, so it is kept here. Made
      // while the parameter has its real shape: its metadata is what backward checks.
      auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
      hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<ReadyHook>(this, i)));
      accumulators_.push_back(std::move(accumulator));
    }
    if (stage() == 3) {
      for (auto& unit : units_) release(unit);
    }
    for (std::size_t u = 0; u < units_.size(); ++u) reduce_order_.push_back(u);
    reset();
  }

  ~Engine() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) {
      accumulators_[i]->del_post_hook(hook_keys_[i]);
    }
    for (auto& unit : units_) {
      if (unit.gather) wait_quietly(*unit.gather);
      if (unit.reduce) wait_quietly(*unit.reduce);
      if (unit.replicate) wait_quietly(*unit.replicate);
    }
  }

  int stage() const { return options_.stage; }
  std::size_t unit_count() const { return units_.size(); }
  bool sync = true;

  std::vector<at::Tensor> shard_parameters() const {
    std::vector<at::Tensor> shards;
    for (const auto& unit : units_) shards.push_back(unit.shard);
    return shards;
  }

  at::Tensor forward(const std::function<at::Tensor()>& run) {
    if (stage() < 3) {
      {
        std::lock_guard lock(mutex_);
        if (stale_) gather_shards();
      }
      return run();
    }
    {
      std::lock_guard lock(mutex_);
      forward_order_.clear();
      if (root_ != kNoUnit) wait_gathered(units_[root_]);
    }
    at::Tensor out = run();
    std::lock_guard lock(mutex_);
    previous_order_ = forward_order_;
    // No backward will follow (evaluation): the root is not needed any more.
    if (root_ != kNoUnit && !(at::GradMode::is_enabled() && out.defined() && out.requires_grad())) {
      release(units_[root_]);
    }
    return out;
  }

  at::Tensor forward_unit(const torch::nn::Module& module, const std::function<at::Tensor()>& run) {
    if (stage() < 3) return run();
    const auto found = unit_of_module_.find(&module);
    if (found == unit_of_module_.end()) {
      throw std::invalid_argument("ShardedDataParallel::forward_unit: the module '" +
                                  module.name() + "' is not one of ShardingOptions::units");
    }
    const std::size_t u = found->second;
    {
      std::lock_guard lock(mutex_);
      const std::size_t position = forward_order_.size();
      forward_order_.push_back(u);
      wait_gathered(units_[u]);
      if (options_.prefetch && position + 1 < previous_order_.size()) {
        start_gather(units_[previous_order_[position + 1]]);
      }
    }
    at::Tensor out = run();
    std::lock_guard lock(mutex_);
    if (at::GradMode::is_enabled() && out.defined() && out.requires_grad()) {
      // Runs when the gradient of the unit's output is known: before the unit's backward.
      out.register_hook([this, u](const at::TensorBase&) { before_backward(u); });
    }
    release(units_[u]);
    return out;
  }

  double clip_grad_norm(double max_norm) {
    at::NoGradGuard no_grad;
    const at::Tensor& any = units_.front().shard;
    at::Tensor squares = at::zeros({1}, any.options().dtype(at::kDouble));
    for (const auto& unit : units_) {
      const at::Tensor& grad = unit.grad_shard;
      if (grad.defined()) squares += grad.to(at::kDouble).pow(2).sum();
    }
    group_.all_reduce(squares);
    const double norm = std::sqrt(squares.item<double>());
    // torch's clip_grad_norm_: the same coefficient, and no scaling up.
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1.0) {
      for (auto& unit : units_) {
        if (unit.grad_shard.defined()) unit.grad_shard.mul_(coefficient);
      }
    }
    return norm;
  }

  void step(torch::optim::Optimizer& optimizer) {
    {
      at::NoGradGuard no_grad;
      // The optimizer sees gradients only now: in the master's type with mixed precision
      // (converted for the moment of the step), else the reduced chunk itself.
      for (auto& unit : units_) {
        if (!unit.grad_shard.defined()) continue;
        unit.shard.mutable_grad() =
            mixed_ ? unit.grad_shard.to(unit.shard.scalar_type()) : unit.grad_shard;
      }
    }
    optimizer.step();
    at::NoGradGuard no_grad;
    std::lock_guard lock(mutex_);
    if (stage() < 3) {
      if (options_.gather_in_step) {
        gather_shards();
      } else {
        stale_ = true;  // gathered by the next forward()
      }
    }
    drop_gradients();
  }

  // A step that is not stepped (fault tolerance: it did not commit), or shards that were
  // replaced (healed from a peer): the reduced gradients go, and the parameters are gathered
  // afresh from the shards when next used (what a failed collective left in them is garbage).
  void discard_step() {
    at::NoGradGuard no_grad;
    std::lock_guard lock(mutex_);
    drop_gradients();  // stage 3: releases every unit too
    if (stage() < 3) stale_ = true;
  }

  // Stages 1-2: every rank's shard into every rank's parameters, in place (with mixed
  // precision, the master rounded into this rank's chunk first).
  void gather_shards() {
    stale_ = false;
    std::vector<std::unique_ptr<Work>> gathers;
    for (auto& unit : units_) {
      at::Tensor mine = alias(unit.full, group_.rank() * unit.layout.shard, unit.layout.shard);
      if (mixed_) mine.copy_(unit.shard.detach());
      gathers.push_back(group_.all_gather_into_async(unit.full, mine));
    }
    for (auto& work : gathers) work->wait();
  }

  std::vector<ShardedUnitView> views() const {
    std::vector<ShardedUnitView> out;
    for (const auto& unit : units_) {
      ShardedUnitView view;
      for (std::size_t k = 0; k < unit.members.size(); ++k) {
        view.names.push_back(names_[unit.members[k]]);
        view.shapes.push_back(unit.views[k].sizes().vec());
      }
      view.layout = unit.layout;
      view.shard = unit.shard;
      out.push_back(std::move(view));
    }
    return out;
  }

  ProcessGroup& group() const { return group_; }

  void gather_all() {
    std::lock_guard lock(mutex_);
    if (stage() < 3) {
      if (stale_) gather_shards();
      return;
    }
    for (auto& unit : units_) start_gather(unit);
    for (auto& unit : units_) wait_gathered(unit);
  }

  void release_all() {
    if (stage() < 3) return;
    std::lock_guard lock(mutex_);
    for (auto& unit : units_) release(unit);
  }

 private:
  static constexpr std::size_t kNoUnit = std::numeric_limits<std::size_t>::max();

  void drop_gradients() {
    for (auto& unit : units_) {
      unit.shard.mutable_grad().reset();
      if (stage() == 1) {
        unit.grad_full.zero_();  // the members' gradients, and grad_shard
      } else {
        unit.grad_shard.reset();
      }
      if (stage() == 3) release(unit);
    }
  }

  struct ReadyHook : torch::autograd::FunctionPostHook {
    ReadyHook(Engine* engine, std::size_t index) : engine(engine), index(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      engine->mark_ready(index);
      return outputs;
    }
    Engine* engine;
    std::size_t index;
  };

  void add_unit(const std::vector<std::size_t>& members, bool root) {
    for (std::size_t m : members) unit_of_[m] = units_.size();
    units_.push_back(sharding::make_unit(
        params_, members, root, {stage(), compute_type_, mixed_, group_.rank(), group_.size()}));
  }

  // Stage 3.
  void start_gather(Unit& unit) {
    if (unit.gathered != Gathered::kNo) return;
    restore_memory(unit.full);
    unit.gather = group_.all_gather_into_async(
        unit.full, mixed_ ? unit.shard.detach().to(compute_type_) : unit.shard.detach());
    unit.gathered = Gathered::kInFlight;
  }

  void wait_gathered(Unit& unit) {
    start_gather(unit);
    if (unit.gathered == Gathered::kInFlight) {
      auto work = std::move(unit.gather);
      work->wait();
      for (std::size_t k = 0; k < unit.members.size(); ++k) {
        params_[unit.members[k]].set_data(unit.views[k]);
      }
      unit.gathered = Gathered::kYes;
    }
  }

  // The members are left as empty tensors meanwhile: a use of one outside forward_unit() is a
  // shape error, not a read of freed memory.
  void release(Unit& unit) {
    if (stage() < 3 || unit.gathered == Gathered::kNo) return;
    if (unit.gather) {
      auto work = std::move(unit.gather);
      wait_quietly(*work);
    }
    if (!placeholder_.defined()) placeholder_ = at::empty({0}, unit.full.options());
    for (std::size_t m : unit.members) params_[m].set_data(placeholder_);
    release_memory(unit.full);
    unit.gathered = Gathered::kNo;
  }

  // On the backward thread, before unit `u`'s backward: its parameters again, and (prefetch)
  // those of the unit before it in this step's forward.
  void before_backward(std::size_t u) {
    std::lock_guard lock(mutex_);
    enter_backward();
    wait_gathered(units_[u]);
    if (!options_.prefetch) return;
    const auto at = std::find(forward_order_.rbegin(), forward_order_.rend(), u);
    if (at != forward_order_.rend() && std::next(at) != forward_order_.rend()) {
      start_gather(units_[*std::next(at)]);
    }
  }

  // The first hook of a backward pass: arranges for finalize() at its end and fixes the order
  // in which units are reduced (the same on every rank).
  void enter_backward() {
    if (in_backward_) return;
    in_backward_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    if (stage() == 3) {
      // Reverse forward order (the order backward finishes them), then the units not run in
      // this forward, the root last.
      reduce_order_.clear();
      std::vector<bool> placed(units_.size(), false);
      for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it) {
        if (!placed[*it]) reduce_order_.push_back(*it);
        placed[*it] = true;
      }
      for (std::size_t u = 0; u < units_.size(); ++u) {
        if (!placed[u] && u != root_) reduce_order_.push_back(u);
      }
      if (root_ != kNoUnit) reduce_order_.push_back(root_);
    }
  }

  void mark_ready(std::size_t index) {
    std::lock_guard lock(mutex_);
    enter_backward();
    if (ready_[index]) {
      throw std::logic_error("ShardedDataParallel: parameter '" + names_[index] +
                             "' got its gradient twice in one backward pass");
    }
    ready_[index] = true;
    Unit& unit = units_[unit_of_[index]];
    if (--unit.pending == 0) complete(unit);
    if (sync) start_ready_units();
  }

  // Every member's gradient is ready (one missing counts as zeros).
  void complete(Unit& unit) {
    at::NoGradGuard no_grad;
    unit.complete = true;
    if (sync) {
      const ShardLayout& layout = unit.layout;
      if (stage() == 1) {
        // The gradients are in grad_full already, unless .grad was replaced (zero_grad with
        // set_to_none, or an undefined one).
        for (std::size_t k = 0; k < unit.members.size(); ++k) {
          at::Tensor& p = params_[unit.members[k]];
          at::Tensor slot =
              alias(unit.grad_full, layout.offsets[k], layout.numels[k]).view(p.sizes());
          const at::Tensor& grad = p.grad();
          if (grad.defined() && grad.data_ptr() == slot.data_ptr()) continue;
          if (grad.defined()) {
            slot.copy_(grad);
          } else {
            slot.zero_();
          }
          p.mutable_grad() = slot;
        }
      } else {
        // One concatenation (one kernel on a GPU), then the whole gradients are freed: from
        // here on the rank holds only its shard of them.
        std::vector<at::Tensor> pieces;
        for (std::size_t k = 0; k < unit.members.size(); ++k) {
          at::Tensor& p = params_[unit.members[k]];
          if (p.grad().defined()) {
            pieces.push_back(p.grad().reshape({-1}));
            p.mutable_grad().reset();
          } else {
            pieces.push_back(at::zeros({layout.numels[k]}, unit.full.options()));
          }
        }
        if (layout.padded > layout.total) {
          pieces.push_back(at::zeros({layout.padded - layout.total}, unit.full.options()));
        }
        unit.grad_input = at::empty({layout.padded}, unit.full.options());
        at::cat_out(unit.grad_input, pieces, 0);
      }
    }
    release(unit);  // stage 3: gathered again by the next forward
  }

  // Starts the completed units' collectives in reduce order: the same order on every rank.
  void start_ready_units() {
    while (next_start_ < reduce_order_.size() && units_[reduce_order_[next_start_]].complete) {
      start(units_[reduce_order_[next_start_++]]);
    }
  }

  void start(Unit& unit) {
    at::NoGradGuard no_grad;
    // Dividing first keeps the sum in range for half precision, as torch does.
    if (stage() == 1) {
      unit.grad_full.div_(group_.size());
      unit.reduce = group_.all_reduce_async(unit.grad_full);
    } else {
      unit.grad_input.div_(group_.size());
      unit.grad_output = at::empty({unit.layout.shard}, unit.full.options());
      unit.reduce = group_.reduce_scatter_async(unit.grad_output, unit.grad_input);
    }
  }

  // At the end of the backward pass, on the thread that called backward().
  void finalize() {
    std::lock_guard lock(mutex_);
    for (auto& unit : units_) {
      if (unit.complete) continue;
      for (std::size_t m : unit.members) ready_[m] = true;
      unit.pending = 0;
      complete(unit);
    }
    if (!sync) {
      reset();
      return;
    }
    start_ready_units();
    try {
      for (std::size_t u : reduce_order_) replicate(units_[u]);
      for (std::size_t u : reduce_order_) finish(units_[u]);
    } catch (...) {
      for (auto& unit : units_) {
        if (unit.reduce) wait_quietly(*unit.reduce);
        if (unit.replicate) wait_quietly(*unit.replicate);
        unit.reduce.reset();
        unit.replicate.reset();
      }
      reset();
      throw;
    }
    reset();
    heartbeat();  // a synchronized step is progress (ctrun --worker_timeout)
  }

  // Once the shard group reduced the unit: HSDP starts averaging this rank's chunk across the
  // replicas (all units' before waiting for any).
  void replicate(Unit& unit) {
    auto work = std::move(unit.reduce);
    work->wait();
    ProcessGroup* replicas = options_.replicate_group;
    if (replicas == nullptr || replicas->size() == 1) return;
    at::NoGradGuard no_grad;
    at::Tensor chunk = stage() == 1 ? unit.grad_shard : unit.grad_output;
    chunk.div_(replicas->size());
    unit.replicate = replicas->all_reduce_async(chunk);
  }

  void finish(Unit& unit) {
    if (unit.replicate) {
      auto work = std::move(unit.replicate);
      work->wait();
    }
    at::NoGradGuard no_grad;
    if (stage() == 1) return;  // grad_shard is an alias into grad_full
    if (unit.grad_shard.defined()) {
      unit.grad_shard.add_(unit.grad_output);
    } else {
      unit.grad_shard = unit.grad_output;
    }
    unit.grad_input.reset();
    unit.grad_output.reset();
  }

  void reset() {
    ready_.assign(params_.size(), false);
    for (auto& unit : units_) {
      unit.pending = unit.members.size();
      unit.complete = false;
    }
    next_start_ = 0;
    in_backward_ = false;
  }

  static void wait_quietly(Work& work) {
    try {
      work.wait();
    } catch (const std::exception&) {
      // the caller is already failing or going away; its own error says more
    }
  }

  ProcessGroup& group_;
  ShardingOptions options_;
  std::vector<at::Tensor> params_;  // those that require a gradient, in registration order
  std::vector<std::string> names_;
  std::vector<Unit> units_;
  std::vector<std::size_t> unit_of_;  // of each parameter
  std::unordered_map<const torch::nn::Module*, std::size_t> unit_of_module_;
  std::size_t root_ = kNoUnit;
  at::ScalarType compute_type_ = at::kFloat;  // of the module's parameters and the collectives
  bool mixed_ = false;                        // compute_type_ is not the master's
  bool stale_ = false;  // stages 1-2: the parameters wait for the shards' gather
  at::Tensor placeholder_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;

  std::mutex mutex_;
  std::vector<bool> ready_;
  std::vector<std::size_t> reduce_order_;
  std::size_t next_start_ = 0;
  bool in_backward_ = false;
  std::vector<std::size_t> forward_order_;   // units run by this step's forward
  std::vector<std::size_t> previous_order_;  // and by the previous one's (for prefetch)
};

ShardedDataParallel::ShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                         ProcessGroup& group, ShardingOptions options)
    : module_(std::move(module)) {
  if (!module_) throw std::invalid_argument("ShardedDataParallel: no module");
  engine_ = std::make_unique<Engine>(*module_, group, std::move(options));
}

ShardedDataParallel::~ShardedDataParallel() = default;

int ShardedDataParallel::stage() const { return engine_->stage(); }
std::size_t ShardedDataParallel::unit_count() const { return engine_->unit_count(); }

std::vector<at::Tensor> ShardedDataParallel::shard_parameters() const {
  return engine_->shard_parameters();
}

at::Tensor ShardedDataParallel::forward(const std::function<at::Tensor()>& run) {
  return engine_->forward(run);
}

at::Tensor ShardedDataParallel::forward_unit(const torch::nn::Module& unit,
                                             const std::function<at::Tensor()>& run) {
  return engine_->forward_unit(unit, run);
}

UnitForward ShardedDataParallel::unit_forward() {
  return [this](const torch::nn::Module& unit, const std::function<at::Tensor()>& run) {
    return forward_unit(unit, run);
  };
}

double ShardedDataParallel::clip_grad_norm(double max_norm) {
  return engine_->clip_grad_norm(max_norm);
}

void ShardedDataParallel::step(torch::optim::Optimizer& optimizer) { engine_->step(optimizer); }

ShardedDataParallel::NoSync::NoSync(ShardedDataParallel& owner)
    : owner_(owner), previous_(owner.engine_->sync) {
  owner_.engine_->sync = false;
}

ShardedDataParallel::NoSync::~NoSync() { owner_.engine_->sync = previous_; }

ShardedDataParallel::FullParameters::FullParameters(ShardedDataParallel& owner) : owner_(owner) {
  owner_.engine_->gather_all();
}

ShardedDataParallel::FullParameters::~FullParameters() { owner_.engine_->release_all(); }

std::vector<ShardedUnitView> ShardedAccess::units(const ShardedDataParallel& model) {
  return model.engine_->views();
}

ProcessGroup& ShardedAccess::group(const ShardedDataParallel& model) {
  return model.engine_->group();
}

void ShardedAccess::release_all(ShardedDataParallel& model) { model.engine_->release_all(); }

void ShardedAccess::discard_step(ShardedDataParallel& model) { model.engine_->discard_step(); }

void ShardedAccess::gather_shards(ShardedDataParallel& model) {
  if (model.stage() < 3) model.engine_->gather_shards();
}

}  // namespace ctrun::worker
