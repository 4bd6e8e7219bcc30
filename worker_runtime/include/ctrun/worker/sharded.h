// Sharded data parallelism for torch::nn::Module (ZeRO stages 1-3; stage 3 is FSDP's
// FULL_SHARD): what DistributedDataParallel does, with the model's state divided among the
// ranks instead of copied to each. Bytes per parameter on each of N ranks, for fp32 Adam:
// DDP 16; stage 1 8 + 8/N; stage 2 4 + 12/N; stage 3 16/N (plus what is gathered for the
// moment: one unit's parameters and gradients, two with prefetch).
//
// The parameters are grouped into units; each unit's parameters live in one flat buffer,
// padded to a multiple of N, of which rank r owns chunk r (its shard). The optimizer steps the
// shards only: build it over shard_parameters(), and step it through step().
//   stage 1: gradients all-reduced in backward, bucket by bucket as DDP does; each rank steps
//            its shard, then the updated shards are all-gathered into every rank's parameters;
//   stage 2: gradients reduce-scattered from the autograd hooks instead, each unit as soon as
//            its last gradient is ready; a rank keeps only its shard of them;
//   stage 3: the parameters are sharded too. The model's forward runs through forward(), and
//            each unit's through forward_unit(), which gathers the unit's parameters just
//            before and frees them just after (gathering the next unit meanwhile); a hook
//            gathers them again before the unit's backward, and they are freed once its
//            gradients are reduced. Parameters in no unit form the root unit, gathered for the
//            whole step.
// Collectives are issued in the same order on every rank. After step() the ranks' parameters
// are bit-identical (stages 1-2), as are their gathered values (stage 3).
// With a replicate group (HSDP) the shards are also averaged across the model's replicas; the
// gradient's global norm (clip_grad_norm) is the shard group's, which every replica shares.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ctrun/worker/process_group.h"
#include "ctrun/worker/torch_forward.h"

namespace ctrun::worker {

struct ShardingOptions {
  int stage = 3;  // 1, 2 or 3
  // Stages 1-2: units of about this many bytes, from the last registered parameter on (the
  // first gradients backward produces are the first reduced).
  std::size_t unit_bytes = 25u << 20;
  // Stage 3: one unit per module (e.g. each transformer block), gathered around its forward and
  // backward; the model must call forward_unit() for each. Not used by stages 1-2.
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  // Stage 3: gather the next unit (by the previous step's order) while this one computes.
  bool prefetch = true;
  // false: rank 0's parameters are not broadcast at construction (they are equal already).
  bool broadcast_parameters = true;
  // Mixed precision: the module's parameters, their gradients and the collectives in this type
  // (at::kBFloat16 on GPUs); the optimizer steps a master copy of each shard in the parameters'
  // own type (fp32). Bytes per parameter with bf16 and Adam: stage 1 4 + 12/N, stage 2
  // 2 + 14/N, stage 3 16/N. Unset: everything in the parameters' type.
  std::optional<at::ScalarType> param_dtype;
  // HSDP (sharded within a replica, replicated across replicas): the ranks that hold this
  // rank's shard in the model's other replicas. Each unit's reduced gradient shard is averaged
  // across them too, so that every replica steps the same shards (FaultTolerance's
  // replicate_group()). nullptr: `group` is the whole world.
  ProcessGroup* replicate_group = nullptr;
  // Stages 1-2: all-gather the updated shards in step() (true), or at the next forward()
  // (false), so that step() issues no collective: per-step fault tolerance commits a step
  // before stepping it, and a gather failing after the commit would leave parameters stale.
  bool gather_in_step = true;
};

// How a model runs one unit's forward: forward_unit() at stage 3, a plain call otherwise.
using UnitForward =
    std::function<at::Tensor(const torch::nn::Module& unit, const std::function<at::Tensor()>&)>;

class ShardedDataParallel {
 public:
  // Every parameter that requires a gradient must be of one floating type, on the group's
  // device. Keeps `group` by reference: it must outlive this object. Throws
  // std::invalid_argument naming what was wrong.
  ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup& group,
                      ShardingOptions options = {});
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  int stage() const;
  std::size_t unit_count() const;

  // This rank's shard of each unit, one flat tensor per unit: what the optimizer steps.
  std::vector<at::Tensor> shard_parameters() const;

  // Runs the model's forward (and loss) in `run`: stage 3 gathers the root unit first.
  at::Tensor forward(const std::function<at::Tensor()>& run);
  // Runs the forward of `unit` (one of ShardingOptions::units) in `run`; see stage 3 above.
  at::Tensor forward_unit(const torch::nn::Module& unit, const std::function<at::Tensor()>& run);
  // forward_unit() as a UnitForward, for the model (which outlives nothing: this must live).
  UnitForward unit_forward();

  // While a NoSync lives, backward only accumulates gradients locally, whole (gradient
  // accumulation micro-steps); the next backward outside it reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(ShardedDataParallel& owner);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    ShardedDataParallel& owner_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // Scales the shards' gradients so that their global L2 norm, over all ranks, is at most
  // `max_norm` (torch's clip_grad_norm_); returns the norm before. A collective.
  double clip_grad_norm(double max_norm);

  // Steps `optimizer` (built over shard_parameters()) on this rank's shards, clears their
  // gradients, and makes the parameters current: stages 1-2 all-gather the shards; stage 3
  // gathers each unit when it is next used. A collective.
  void step(torch::optim::Optimizer& optimizer);

  // While it lives, every parameter of the module holds its whole value on every rank (for a
  // digest, an evaluation, a whole checkpoint). Stage 3 gathers all units (a collective) and
  // frees them again when it ends; stages 1-2 have nothing to do.
  class FullParameters {
   public:
    explicit FullParameters(ShardedDataParallel& owner);
    ~FullParameters();
    FullParameters(const FullParameters&) = delete;
    FullParameters& operator=(const FullParameters&) = delete;

   private:
    ShardedDataParallel& owner_;
  };
  FullParameters full_parameters() { return FullParameters(*this); }

 private:
  friend class ShardedAccess;  // the sharded checkpoints' view of the units (src/)
  class Engine;
  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace ctrun::worker
