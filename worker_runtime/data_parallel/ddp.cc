#include "ctrun/worker/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>

#include "ctrun/worker/heartbeat.h"
#include "worker_runtime/process_groups/coalesced.h"

namespace ctrun::worker {

class DistributedDataParallel::Reducer {
 public:
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, ProcessGroup& group,
          DdpOptions options)
      : params_(std::move(params)),
        names_(std::move(names)),
        group_(group),
        options_(std::move(options)) {
    build_buckets();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (bucket_of_[i] == kNoBucket) continue;
      // The accumulator is what torch's own reducer hooks: its post hook runs after the
      // gradient is in .grad. The variable holds it only weakly, so we keep it alive.
      auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
      hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<ReadyHook>(this, i)));
      accumulators_.push_back(std::move(accumulator));
    }
    reset();
  }

  ~Reducer() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) {
      accumulators_[i]->del_post_hook(hook_keys_[i]);
    }
  }

  const std::vector<DdpBucket>& buckets() const { return buckets_; }
  bool sync = true;

 private:
  static constexpr std::size_t kNoBucket = std::numeric_limits<std::size_t>::max();

  struct ReadyHook : torch::autograd::FunctionPostHook {
    ReadyHook(Reducer* reducer, std::size_t index) : reducer(reducer), index(index) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      reducer->mark_ready(index);
      return outputs;
    }
    Reducer* reducer;
    std::size_t index;
  };

  struct BucketState {
    at::Tensor flat;
    std::vector<int64_t> offsets;  // of each parameter's gradient in `flat`
    std::size_t pending = 0;       // gradients not yet ready in this backward
    std::unique_ptr<Work> work;
  };

  // Reverse registration order, one open bucket per dtype and device; the first bucket closes
  // at first_bucket_bytes, the rest at bucket_bytes.
  void build_buckets() {
    bucket_of_.assign(params_.size(), kNoBucket);
    std::map<std::pair<int, std::string>, std::size_t> open;
    for (std::size_t n = params_.size(); n-- > 0;) {
      const at::Tensor& p = params_[n];
      if (!p.requires_grad()) continue;
      const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
      auto it = open.find(key);
      if (it == open.end()) {
        it = open.emplace(key, buckets_.size()).first;
        buckets_.emplace_back();
        states_.emplace_back();
      }
      const std::size_t b = it->second;
      DdpBucket& bucket = buckets_[b];
      states_[b].offsets.push_back(static_cast<int64_t>(bucket.bytes / p.element_size()));
      bucket.parameters.push_back(n);
      bucket.bytes += static_cast<std::size_t>(p.numel()) * p.element_size();
      bucket_of_[n] = b;
      const std::size_t cap = !options_.overlap ? std::numeric_limits<std::size_t>::max()
                              : b == 0          ? options_.first_bucket_bytes
                                                : options_.bucket_bytes;
      if (bucket.bytes >= cap) open.erase(it);
    }
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const at::Tensor& first = params_[buckets_[b].parameters.front()];
      states_[b].flat = at::zeros({static_cast<int64_t>(buckets_[b].bytes / first.element_size())},
                                  first.options().requires_grad(false));
    }
  }

  void reset() {
    ready_.assign(params_.size(), false);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      states_[b].pending = buckets_[b].parameters.size();
      states_[b].work.reset();
    }
    next_start_ = 0;
    in_backward_ = false;
  }

  void mark_ready(std::size_t index) {
    std::lock_guard lock(mutex_);
    if (!sync) return;
    if (!in_backward_) {
      in_backward_ = true;
      // Runs once the whole backward pass is done, on the thread that called backward().
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    }
    if (ready_[index]) {
      throw std::logic_error("DistributedDataParallel: parameter '" + names_[index] +
                             "' got its gradient twice in one backward pass");
    }
    ready_[index] = true;
    --states_[bucket_of_[index]].pending;
    if (options_.overlap) start_ready_buckets();
  }

  // Starts the ready buckets in index order: the same collectives in the same order everywhere.
  void start_ready_buckets() {
    while (next_start_ < buckets_.size() && states_[next_start_].pending == 0) {
      start(next_start_++);
    }
  }

  void start(std::size_t b) {
    at::NoGradGuard no_grad;
    BucketState& state = states_[b];
    const auto& members = buckets_[b].parameters;
    // One concatenation into the bucket when every gradient is there (one kernel on a GPU,
    // where a copy per parameter costs a launch each); an unused parameter contributes zeros.
    std::vector<at::Tensor> grads;
    grads.reserve(members.size());
    for (std::size_t member : members) {
      const at::Tensor& grad = params_[member].grad();
      if (!grad.defined()) break;
      grads.push_back(grad.reshape({-1}));
    }
    if (grads.size() == members.size()) {
      at::cat_out(state.flat, grads, 0);
    } else {
      for (std::size_t k = 0; k < members.size(); ++k) {
        const at::Tensor& p = params_[members[k]];
        at::Tensor slot = state.flat.narrow(0, state.offsets[k], p.numel());
        const at::Tensor& grad = p.grad();
        if (grad.defined()) {
          slot.view(grad.sizes()).copy_(grad);
        } else {
          slot.zero_();
        }
      }
    }
    // Dividing first keeps the sum in range for half precision, as torch does.
    state.flat.div_(group_.size());
    if (options_.on_bucket_start) options_.on_bucket_start(b);
    state.work = group_.all_reduce_async(state.flat);
  }

  void finalize() {
    std::lock_guard lock(mutex_);
    std::string unused;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (bucket_of_[i] == kNoBucket || ready_[i]) continue;
      if (!options_.find_unused_parameters) {
        unused += (unused.empty() ? "'" : ", '") + names_[i] + "'";
        continue;
      }
      ready_[i] = true;
      --states_[bucket_of_[i]].pending;
    }
    if (!unused.empty()) {
      wait_started();
      reset();
      throw std::runtime_error(
          "DistributedDataParallel: parameter(s) " + unused +
          " got no gradient in this backward pass; if the model does not use every parameter "
          "in every step, set DdpOptions::find_unused_parameters");
    }
    start_ready_buckets();
    try {
      for (std::size_t b = 0; b < buckets_.size(); ++b) finish(b);
    } catch (...) {
      wait_started();
      reset();
      throw;
    }
    reset();
    heartbeat();  // a synchronized step is progress (ctrun --worker_timeout)
  }

  void finish(std::size_t b) {
    BucketState& state = states_[b];
    state.work->wait();
    state.work.reset();
    at::NoGradGuard no_grad;
    const auto& members = buckets_[b].parameters;
    for (std::size_t k = 0; k < members.size(); ++k) {
      at::Tensor& p = params_[members[k]];
      at::Tensor averaged = state.flat.narrow(0, state.offsets[k], p.numel()).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else {
        p.mutable_grad() = averaged.clone();
      }
    }
  }

  // Before giving up on a step, lets started collectives end, so none writes into a bucket
  // that a later step reuses.
  void wait_started() {
    for (auto& state : states_) {
      if (!state.work) continue;
      try {
        state.work->wait();
      } catch (const std::exception&) {
        // the caller is already failing; its own error says more
      }
      state.work.reset();
    }
  }

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroup& group_;
  DdpOptions options_;
  std::vector<DdpBucket> buckets_;
  std::vector<BucketState> states_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;

  std::mutex mutex_;
  std::vector<bool> ready_;
  std::size_t next_start_ = 0;
  bool in_backward_ = false;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 ProcessGroup& group, DdpOptions options)
    : module_(std::move(module)), group_(group) {
  if (!module_) throw std::invalid_argument("DistributedDataParallel: no module");
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters()) {
    names.push_back(item.key());
    params.push_back(item.value());
  }
  std::vector<at::Tensor> state = params;
  for (const auto& buffer : module_->buffers()) state.push_back(buffer);
  if (options.broadcast_parameters) broadcast_coalesced(group_, state);
  reducer_ =
      std::make_unique<Reducer>(std::move(params), std::move(names), group_, std::move(options));
}

DistributedDataParallel::~DistributedDataParallel() = default;

const std::vector<DdpBucket>& DistributedDataParallel::buckets() const {
  return reducer_->buckets();
}

void DistributedDataParallel::broadcast_buffers() {
  broadcast_coalesced(group_, module_->buffers());
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.reducer_->sync) {
  ddp_.reducer_->sync = false;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.reducer_->sync = previous_; }

}  // namespace ctrun::worker
