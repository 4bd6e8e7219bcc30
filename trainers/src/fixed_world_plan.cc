// The steps of a fixed world: the seeds' DDP recipe (DistributedSampler with set_epoch, gradient
// accumulation, rank-0 logging, rank-0 or sharded checkpoints, resume in any world size).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <optional>
#include <stdexcept>

#include "ctrun/worker/checkpoint.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/heartbeat.h"
#include "ctrun/worker/log.h"
#include "ctrun/worker/lr_schedule.h"
#include "ctrun/worker/sampler.h"
#include "ctrun/worker/sharded.h"
#include "ctrun/worker/sharded_checkpoint.h"
#include "ctrun/worker/throughput.h"
#include "step_plan.h"

namespace ctrun::trainers {

using worker::fixed;
using worker::log_rank0;

namespace {

class FixedWorldPlan final : public StepPlan {
 public:
  FixedWorldPlan(const TrainOptions& o, Run& run, TrainTask& task)
      : StepPlan(o, run, task), rank_(run.env.rank), world_(run.env.world_size) {
    who_ = "rank" + std::to_string(rank_);
    if (o.zero != 0 && o.no_ddp) throw std::invalid_argument("--zero and --no_ddp: choose one");
    std::int64_t parameter_count = 0;  // counted before a sharded wrapper takes them apart
    for (const auto& p : task.model->parameters()) parameter_count += p.numel();
    // Before the optimizer: with --zero it steps the shards the wrapper makes.
    if (o.zero != 0) {
      sharded_.emplace(task.model, *run.group, sharding_options(o, task));
      if (o.zero == 3 && task.route_unit_forward) task.route_unit_forward(sharded_->unit_forward());
    }
    optimizer_ = task.make_optimizer(
        sharded_ ? sharded_->shard_parameters() : task.model->parameters(), o.lr);

    // Whole checkpoints (rank 0 writes) for a replicated model, sharded ones (every rank
    // writes its shards) with --zero; each kind resumes from the other.
    progress_.world_size = world_;
    if (checkpointing()) {
      if (sharded_) {
        sharded_checkpointer_.emplace(o.checkpoint_dir);
      } else {
        whole_checkpointer_.emplace(o.checkpoint_dir, rank_);
      }
      auto loaded = sharded_ ? sharded_checkpointer_->load_latest(*sharded_, *optimizer_)
                             : whole_checkpointer_->load_latest(*task.model, *optimizer_);
      if (loaded) {
        log_rank0(rank_, "resumed at step " + std::to_string(loaded->step) + " (epoch " +
                             std::to_string(loaded->epoch + 1) + ", written by a world of " +
                             std::to_string(loaded->world_size) + ", now " +
                             std::to_string(world_) + ")");
        progress_ = *loaded;
        progress_.world_size = world_;
      }
    }
    if (o.no_ddp && world_ != 1) {
      throw std::invalid_argument(
          "--no_ddp trains one replica alone: it needs a world size of 1, got " +
          std::to_string(world_));
    }
    if (!o.no_ddp && !sharded_) ddp_.emplace(task.model, *run.group, ddp_options(o));

    worker::SamplerOptions sampler_options;
    sampler_options.dataset_size = task.dataset_size;
    sampler_options.seed = o.seed;
    sampler_.emplace(sampler_options, rank_, world_);
    samples_per_step_ = static_cast<std::int64_t>(o.batch_size) * o.grad_accum;
    sampler_->set_epoch(0);
    const std::int64_t steps_per_epoch =
        (static_cast<std::int64_t>(sampler_->num_samples()) + samples_per_step_ - 1) /
        samples_per_step_;
    const double peak_lr = o.scale_lr ? worker::scale_lr_linearly(o.lr, world_) : o.lr;
    schedule_ = {peak_lr, o.warmup_steps, o.cosine ? steps_per_epoch * o.epochs : 0, 0.0};
    log_rank0(rank_, "training " + std::to_string(parameter_count) + " parameters on " +
                         std::to_string(task.dataset_size) + " samples, " + std::to_string(world_) +
                         " rank(s), " + std::to_string(o.batch_size) + " per rank x " +
                         std::to_string(o.grad_accum) + " micro-steps, " +
                         (ddp_ ? std::to_string(ddp_->buckets().size()) + " gradient bucket(s)"
                          : sharded_ ? "ZeRO stage " + std::to_string(o.zero) + ", " +
                                           std::to_string(sharded_->unit_count()) + " unit(s)"
                                     : std::string("no DDP")) +
                         ", lr " + fixed(peak_lr, 6));
    epoch_ = progress_.epoch;
  }

  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  worker::DistributedDataParallel* ddp() override { return ddp_ ? &*ddp_ : nullptr; }
  worker::ShardedDataParallel* sharded() override { return sharded_ ? &*sharded_ : nullptr; }
  std::int64_t committed() const override { return progress_.step; }

  std::optional<Step> next() override {
    for (;;) {
      if (!in_epoch_) {
        if (epoch_ >= options_.epochs) return std::nullopt;
        begin_epoch();
      }
      if (pos_ < static_cast<std::int64_t>(mine_.size())) {
        if (options_.max_steps > 0 && progress_.step >= options_.max_steps) {
          // Stopped mid-epoch: a later run with a larger limit continues from here.
          if (checkpointing()) save_mid_epoch();
          epoch_ = options_.epochs;
          return std::nullopt;
        }
        started_ = std::chrono::steady_clock::now();
        step_begin_ = pos_;
        const std::int64_t step_end =
            std::min(static_cast<std::int64_t>(mine_.size()), pos_ + samples_per_step_);
        Step step;
        for (; pos_ < step_end; pos_ += options_.batch_size) {
          step.micro_batches.push_back(
              all_.slice(0, pos_, std::min(step_end, pos_ + options_.batch_size)));
        }
        pos_ = step_end;
        return step;
      }
      end_epoch();
    }
  }

  bool commit() override { return true; }
  double learning_rate() const override { return schedule_.lr_at(progress_.step); }

  void applied(double loss_sum, int losses) override {
    loss_sum_ += loss_sum;
    loss_count_ += losses;
    ++progress_.step;
    worker::report_step(progress_.step);  // ctrun --faults at a step
    if (consumed_.enabled()) {
      consumed_.commit(who_, static_cast<std::uint64_t>(epoch_), progress_.step,
                       {mine_.begin() + step_begin_, mine_.begin() + pos_});
    }
    throughput_.record(static_cast<std::uint64_t>(losses * options_.batch_size),
                       std::chrono::steady_clock::now() - started_);
    if (options_.log_every > 0 && progress_.step % options_.log_every == 0) {
      log_rank0(rank_, "step " + std::to_string(progress_.step) + " loss " +
                           fixed(loss_sum_ / std::max(loss_count_, 1.0), 6) + " step_ms " +
                           fixed(throughput_.seconds_per_step() * 1e3, 2) + " samples/s " +
                           fixed(throughput_.samples_per_second() * world_, 1));
    }
    if (checkpointing() && options_.checkpoint_every > 0 &&
        progress_.step % options_.checkpoint_every == 0 &&
        pos_ < static_cast<std::int64_t>(mine_.size())) {
      save_mid_epoch();
    }
  }

  // The sharded step clears the shards' gradients itself.
  void clear_gradients(bool) override {
    if (!sharded_) optimizer_->zero_grad();
  }

  int finish() override {
    double final_loss = 0;
    if (sharded_) {
      {
        auto whole = sharded_->full_parameters();
        check_replicas();
      }
      // Through the wrapper, which gathers one unit at a time.
      final_loss =
          sharded_->forward([&] { return torch::tensor(task_.evaluate(), torch::kDouble); })
              .item<double>();
    } else {
      check_replicas();
      final_loss = task_.evaluate();
    }
    log_rank0(rank_, "final loss " + fixed(final_loss, 6) + " after " +
                         std::to_string(progress_.step) + " steps, samples/s " +
                         fixed(throughput_.samples_per_second() * world_, 1));
    return 0;
  }

 private:
  bool checkpointing() const { return !options_.checkpoint_dir.empty(); }

  void begin_epoch() {
    sampler_->set_epoch(static_cast<std::uint64_t>(epoch_));
    if (epoch_ == progress_.epoch) sampler_->set_consumed(progress_.epoch_consumed);
    start_consumed_ = sampler_->consumed();
    mine_ = sampler_->indices();
    all_ = torch::tensor(std::vector<int64_t>(mine_.begin(), mine_.end()), torch::kLong);
    loss_sum_ = progress_.values["loss_sum"];
    loss_count_ = progress_.values["loss_count"];
    pos_ = 0;
    in_epoch_ = true;
  }

  void end_epoch() {
    log_rank0(rank_, "epoch " + std::to_string(epoch_ + 1) + "/" + std::to_string(options_.epochs) +
                         " loss " + fixed(loss_sum_ / std::max(loss_count_, 1.0), 6) +
                         " samples/s " + fixed(throughput_.samples_per_second() * world_, 1));
    progress_.epoch = epoch_ + 1;
    progress_.epoch_consumed = 0;
    progress_.values = {{"loss_sum", 0.0}, {"loss_count", 0.0}};
    if (checkpointing()) save(progress_);
    ++epoch_;
    in_epoch_ = false;
  }

  void save_mid_epoch() {
    progress_.epoch = epoch_;
    progress_.epoch_consumed = start_consumed_ + static_cast<std::uint64_t>(pos_) * world_;
    progress_.values = {{"loss_sum", loss_sum_}, {"loss_count", loss_count_}};
    save(progress_);
  }

  void save(const worker::TrainingProgress& at) {
    if (sharded_) {
      sharded_checkpointer_->save(*sharded_, *optimizer_, at);
    } else {
      whole_checkpointer_->save(*task_.model, *optimizer_, at);
    }
  }

  // DDP's promise, checked once at the end: every rank holds bit-identical parameters (with
  // --zero, the whole ones it gathers).
  void check_replicas() {
    const std::uint64_t digest = parameter_digest(*task_.model);
    const auto gathered = run_.group->all_gather(
        torch::tensor({static_cast<int64_t>(digest)}, torch::kLong).to(run_.device));
    for (std::size_t r = 0; r < gathered.size(); ++r) {
      if (gathered[r].item<int64_t>() != static_cast<int64_t>(digest)) {
        throw std::runtime_error("parameters differ between rank " + std::to_string(rank_) +
                                 " and rank " + std::to_string(r) + " after training");
      }
    }
    log_rank0(rank_, "parameters identical on all " + std::to_string(gathered.size()) +
                         " rank(s), digest " + digest_hex(digest));
    write_result(digest);
  }

  const int rank_;
  const int world_;
  // Declared in the order they are made; destroyed the other way.
  std::optional<worker::ShardedDataParallel> sharded_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<worker::Checkpointer> whole_checkpointer_;
  std::optional<worker::ShardedCheckpointer> sharded_checkpointer_;
  std::optional<worker::DistributedDataParallel> ddp_;
  std::optional<worker::DistributedSampler> sampler_;
  worker::WarmupCosineSchedule schedule_{};
  worker::Throughput throughput_;
  worker::TrainingProgress progress_;
  std::int64_t samples_per_step_ = 1;
  // The epoch under way: this rank's samples, where the next step starts, the loss so far.
  std::int64_t epoch_ = 0;
  bool in_epoch_ = false;
  std::uint64_t start_consumed_ = 0;
  std::vector<std::uint64_t> mine_;
  torch::Tensor all_;
  std::int64_t pos_ = 0;
  std::int64_t step_begin_ = 0;
  double loss_sum_ = 0;
  double loss_count_ = 0;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace

std::unique_ptr<StepPlan> fixed_world_plan(const TrainOptions& options, Run& run, TrainTask& task) {
  return std::make_unique<FixedWorldPlan>(options, run, task);
}

}  // namespace ctrun::trainers
