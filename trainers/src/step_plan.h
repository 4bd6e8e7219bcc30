// What differs between training in a fixed world and training on per-step quorums
// (--fault_tolerant): where each step's samples come from, whether a step counts, and what is
// logged, saved and checked. train() (train_loop.cc) is the one loop around a StepPlan: each
// step's forward and backward (micro-steps under no_sync), planned faults, clipping, the LR and
// the optimizer's step.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "consumed_log.h"
#include "train_loop.h"

namespace ctrun::trainers {

class StepPlan {
 public:
  struct Step {
    // This worker's samples of the step, one tensor (int64, CPU) per micro-step; a quorum
    // member with no sample in a short last step has one empty tensor (it still sends zero
    // gradients).
    std::vector<torch::Tensor> micro_batches;
    // The loss of a sample weighs this much (a quorum member's share of the step's samples).
    double loss_share = 1.0;
  };

  StepPlan(const TrainOptions& options, Run& run, TrainTask& task)
      : options_(options), run_(run), task_(task), consumed_(options.consumed_log) {}
  virtual ~StepPlan() = default;

  // The model's optimizer and the wrapper that synchronises its gradients (one of the two, or
  // neither with --no_ddp).
  virtual torch::optim::Optimizer& optimizer() = 0;
  virtual worker::DistributedDataParallel* ddp() = 0;
  virtual worker::ShardedDataParallel* sharded() = 0;

  // The next step, or nothing once the training is over (its epochs, --max_steps, or the other
  // replicas finished it).
  virtual std::optional<Step> next() = 0;
  // Steps committed so far: what --inject_kill_at_step and --inject_hang_at_step count.
  virtual std::int64_t committed() const = 0;
  // After the step's backward: whether it counts (a quorum's collectives all succeeded).
  virtual bool commit() = 0;
  // The learning rate of the step being applied.
  virtual double learning_rate() const = 0;
  // The optimizer stepped: the step's logs, consumed-log line and checkpoint. `loss_sum` and
  // `losses`: the unscaled losses of the micro-steps that had samples.
  virtual void applied(double loss_sum, int losses) = 0;
  // Gradients left after the step (`committed` or not) are dropped.
  virtual void clear_gradients(bool committed) = 0;
  // The end: the replicas compared, the final loss. Returns the exit code.
  virtual int finish() = 0;

  // Who this worker is in the consumed log.
  const std::string& who() const { return who_; }
  ConsumedLog& consumed() { return consumed_; }

 protected:
  const TrainOptions& options_;
  Run& run_;
  TrainTask& task_;
  ConsumedLog consumed_;
  std::string who_;
};

// A fixed world (init_process_group's): DistributedSampler, every step commits, rank-0 logs,
// whole or sharded checkpoints and resume.
std::unique_ptr<StepPlan> fixed_world_plan(const TrainOptions& options, Run& run, TrainTask& task);
// Per-step quorums (--fault_tolerant under ctrun --fault_tolerance=step): FaultTolerance's step,
// the exact StepSampler, a step that does not commit redone (quorum_step_plan.cc).
std::unique_ptr<StepPlan> quorum_step_plan(const TrainOptions& options, Run& run, TrainTask& task);

}  // namespace ctrun::trainers
