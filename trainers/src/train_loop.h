// The training loop both trainers share: the seeds' DDP recipe (DistributedSampler with
// set_epoch, gradient accumulation under no_sync, LR scaling, warmup and cosine decay, gradient
// clipping, rank-0 logging, rank-0 checkpoints, resume) around a model and a loss the trainer
// provides.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ctrun/worker/ddp.h"
#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"
#include "ctrun/worker/sharded.h"
#include "ctrun/worker/torch_forward.h"
#include "train_options.h"

namespace ctrun::trainers {

// The world this worker trains in.
struct Run {
  worker::WorkerEnv env;
  torch::Device device = torch::kCPU;
  std::unique_ptr<worker::ProcessGroup> group;  // none with --fault_tolerant (the quorum's)
};

// Reads nothing from the process: `env` comes from read_worker_env. Seeds torch's generator
// with --seed so every rank builds the same initial model. Throws with a one-line reason.
Run start_run(const TrainOptions& options, const worker::WorkerEnv& env);

struct TrainTask {
  std::shared_ptr<torch::nn::Module> model;  // already on the run's device
  std::uint64_t dataset_size = 0;
  // Mean loss over the samples `indices` (int64, CPU).
  std::function<torch::Tensor(const torch::Tensor& indices)> loss;
  // Mean loss over a fixed evaluation set (no gradients), printed at the end.
  std::function<double()> evaluate;
  // The optimizer over `parameters` (the model's, or with --zero its shards).
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor> parameters,
                                                         double lr)>
      make_optimizer;
  // --zero 3: the modules sharded one at a time (gpt: its blocks; none: the model is one unit),
  // and how the model sends their forward through the sharded wrapper.
  std::vector<std::shared_ptr<torch::nn::Module>> shard_units;
  std::function<void(worker::UnitForward)> route_unit_forward;
  // --zero: the parameters' type while they compute (gpt --bf16: bf16, fp32 masters).
  std::optional<at::ScalarType> shard_param_dtype;
};

// The flags' settings of DDP and of ShardedDataParallel, which both loops build.
worker::DdpOptions ddp_options(const TrainOptions& options);
worker::ShardingOptions sharding_options(const TrainOptions& options, const TrainTask& task);

// The parameters' bytes hashed (FNV-1a, 64 bits): equal on replicas that are bit-identical.
std::uint64_t parameter_digest(const torch::nn::Module& model);
std::string digest_hex(std::uint64_t digest);  // 16 hex digits, as the trainers print it
// The digest into CTRUN_RESULT_FILE when the launcher names one (ctrun --fault_report quotes
// it, so that a faulted run is compared with a clean one).
void write_result(std::uint64_t digest);

// Trains for options.epochs (or max_steps), resuming from --checkpoint_dir; with
// --fault_tolerant on per-step quorums. One loop around a StepPlan (step_plan.h). Returns 0.
int train(const TrainOptions& options, Run& run, TrainTask& task);

}  // namespace ctrun::trainers
