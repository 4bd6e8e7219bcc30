#include "train_loop.h"

#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>
#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "ctrun/worker/ddp.h"
#include "ctrun/worker/log.h"
#include "ctrun/worker/malloc_tuning.h"
#include "step_plan.h"

namespace ctrun::trainers {

Run start_run(const TrainOptions& options, const worker::WorkerEnv& env) {
  worker::tune_malloc_for_training();
  Run run;
  run.env = env;
  if (options.device == "cuda") {
    if (!torch::cuda::is_available()) {
      throw std::runtime_error(
          "--device cuda: no CUDA device (this LibTorch has no CUDA, or none is visible)");
    }
    run.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  }
  const std::string backend =
      options.backend.empty() ? (options.device == "cuda" ? "nccl" : "gloo") : options.backend;
  worker::ProcessGroupOptions pg_options;
  pg_options.backend = worker::parse_backend(backend);
  pg_options.timeout = std::chrono::seconds(options.timeout_s);
  // A fault-tolerant worker has no fixed world: its communicator is each quorum's.
  if (!options.fault_tolerant) run.group = worker::init_process_group(env, pg_options);
  torch::manual_seed(options.seed);
  return run;
}

std::uint64_t parameter_digest(const torch::nn::Module& model) {
  std::uint64_t digest = 1469598103934665603ULL;  // FNV-1a over the parameters' bytes
  for (const auto& p : model.parameters()) {
    const torch::Tensor cpu = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(cpu.data_ptr());
    for (std::size_t i = 0; i < cpu.nbytes(); ++i) digest = (digest ^ bytes[i]) * 1099511628211ULL;
  }
  return digest;
}

worker::DdpOptions ddp_options(const TrainOptions& o) {
  worker::DdpOptions options;
  options.first_bucket_bytes = static_cast<std::size_t>(o.first_bucket_mb * (1 << 20));
  options.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20));
  options.overlap = !o.no_overlap;
  options.find_unused_parameters = o.find_unused_parameters;
  return options;
}

worker::ShardingOptions sharding_options(const TrainOptions& o, const TrainTask& task) {
  worker::ShardingOptions options;
  options.stage = o.zero;
  options.unit_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20));
  options.units = task.shard_units;
  options.param_dtype = task.shard_param_dtype;
  return options;
}

std::string digest_hex(std::uint64_t digest) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return hex;
}

void write_result(std::uint64_t digest) {
  if (const char* path = std::getenv("CTRUN_RESULT_FILE"); path && *path) {
    std::ofstream(path) << digest_hex(digest) << "\n";
  }
}

namespace {

torch::Tensor zero_loss(const torch::nn::Module& model) {
  torch::Tensor sum;
  for (const auto& p : model.parameters()) {
    sum = sum.defined() ? sum + p.sum() * 0 : p.sum() * 0;
  }
  return sum;
}

// --inject_kill_at_step and --inject_hang_at_step: the last rank of the first attempt, before
// the step after `committed` steps.
void inject_planned_faults(const TrainOptions& o, const Run& run, StepPlan& plan) {
  if (run.env.restart_count != 0 || run.env.rank != run.env.world_size - 1) return;
  if (plan.committed() == o.inject_kill_at_step) {
    plan.consumed().fault(plan.who(), plan.committed());
    std::raise(SIGKILL);
  }
  if (plan.committed() == o.inject_hang_at_step) {
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace

int train(const TrainOptions& o, Run& run, TrainTask& task) {
  const std::unique_ptr<StepPlan> plan =
      o.fault_tolerant ? quorum_step_plan(o, run, task) : fixed_world_plan(o, run, task);
  worker::DistributedDataParallel* ddp = plan->ddp();
  worker::ShardedDataParallel* sharded = plan->sharded();
  torch::optim::Optimizer& optimizer = plan->optimizer();
  while (auto step = plan->next()) {
    inject_planned_faults(o, run, *plan);
    // The step's gradient is the mean over its micro-steps; every micro-step but the last only
    // accumulates locally.
    const std::size_t micro_steps = step->micro_batches.size();
    double loss_sum = 0;
    int losses = 0;
    for (std::size_t i = 0; i < micro_steps; ++i) {
      const torch::Tensor& indices = step->micro_batches[i];
      const bool has_samples = indices.numel() > 0;
      auto forward = [&] {
        if (has_samples) return task.loss(indices);
        // No sample (a quorum's short last step): zero gradients all the same; sharded,
        // through the model's own forward, which gathers what stage 3 needs.
        return sharded ? task.loss(torch::zeros({1}, torch::kLong)) * 0.0 : zero_loss(*task.model);
      };
      torch::Tensor loss = sharded ? sharded->forward(forward) : forward();
      if (has_samples) {
        loss_sum += loss.item<double>();
        ++losses;
        if (step->loss_share != 1.0) loss = loss * step->loss_share;
      }
      if (micro_steps > 1) loss = loss / static_cast<double>(micro_steps);
      if (i + 1 == micro_steps) {
        loss.backward();
      } else if (ddp) {
        auto no_sync = ddp->no_sync();
        loss.backward();
      } else if (sharded) {
        auto no_sync = sharded->no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    if (o.clip_grad_norm > 0) {
      if (sharded) {
        sharded->clip_grad_norm(o.clip_grad_norm);
      } else {
        torch::nn::utils::clip_grad_norm_(task.model->parameters(), o.clip_grad_norm);
      }
    }
    const bool committed = plan->commit();
    if (committed) {
      const double lr = plan->learning_rate();
      for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
      if (sharded) {
        sharded->step(optimizer);
      } else {
        optimizer.step();
      }
    }
    plan->clear_gradients(committed);
    if (committed) plan->applied(loss_sum, losses);
  }
  return plan->finish();
}

}  // namespace ctrun::trainers
