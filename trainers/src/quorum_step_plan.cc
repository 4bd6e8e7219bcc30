// The steps of --fault_tolerant (under ctrun --fault_tolerance=step): every step on the quorum
// FaultTolerance forms, the exact StepSampler, a step that does not commit redone.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>  // getpid

#include <chrono>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "ctrun/worker/checkpoint.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/fault_tolerance.h"
#include "ctrun/worker/log.h"
#include "ctrun/worker/lr_schedule.h"
#include "ctrun/worker/sampler.h"
#include "ctrun/worker/sharded.h"
#include "ctrun/worker/throughput.h"
#include "step_plan.h"

namespace ctrun::trainers {

using worker::fixed;

namespace {

// The flags --fault_tolerant cannot train with, refused before anything starts.
const TrainOptions& checked(const TrainOptions& o) {
  if (o.grad_accum != 1) {
    throw std::invalid_argument("--grad_accum " + std::to_string(o.grad_accum) +
                                ": --fault_tolerant trains one micro-step per step");
  }
  if (o.no_ddp) throw std::invalid_argument("--no_ddp: --fault_tolerant trains through DDP");
  if (o.zero != 0 && !o.checkpoint_dir.empty()) {
    throw std::invalid_argument(
        "--checkpoint_dir with --fault_tolerant --zero: sharded replicas heal from each other "
        "but do not write or resume checkpoints yet; leave one of them out");
  }
  if (o.ft_shard_group != 0 && o.zero == 0) {
    throw std::invalid_argument("--ft_shard_group " + std::to_string(o.ft_shard_group) +
                                ": shard groups shard a model, give --zero 1, 2 or 3 too");
  }
  return o;
}

worker::FaultToleranceOptions fault_tolerance_options(const TrainOptions& o) {
  worker::FaultToleranceOptions ft;
  ft.backend =
      worker::parse_backend(o.backend.empty() ? (o.device == "cuda" ? "nccl" : "gloo") : o.backend);
  ft.min_replicas = o.ft_min_replicas;
  ft.collective_timeout = std::chrono::milliseconds(o.ft_collective_timeout_ms);
  ft.heartbeat_timeout = std::chrono::milliseconds(o.ft_heartbeat_timeout_ms);
  ft.join_timeout = std::chrono::milliseconds(o.ft_join_timeout_ms);
  ft.quorum_timeout = std::chrono::milliseconds(o.ft_quorum_timeout_ms);
  return ft;
}

class QuorumStepPlan final : public StepPlan {
 public:
  QuorumStepPlan(const TrainOptions& o, Run& run, TrainTask& task)
      : StepPlan(checked(o), run, task) {
    who_ = run.env.replica_id;
    // With --zero the optimizer steps the shards, which exist once the shard group does.
    if (o.zero == 0) optimizer_ = task.make_optimizer(task.model->parameters(), o.lr);

    worker::SamplerOptions sampler_options;
    sampler_options.dataset_size = task.dataset_size;
    sampler_options.seed = o.seed;
    sampler_.emplace(sampler_options, static_cast<std::uint64_t>(o.batch_size));

    worker::FaultToleranceOptions ft_options = fault_tolerance_options(o);
    // A whole-job loss resumes from the last checkpoint; a replica replaced while its peers
    // train on heals from them instead (its checkpoint is older than their step).
    std::int64_t resumed_step = 0;
    if (!o.checkpoint_dir.empty()) {
      checkpointer_.emplace(o.checkpoint_dir, 0);
      if (auto loaded = checkpointer_->load_latest(*task.model, *optimizer_)) {
        resumed_step = loaded->step;
        sampler_->restore(static_cast<std::uint64_t>(loaded->epoch), loaded->epoch_consumed);
        say("resumed at step " + std::to_string(resumed_step));
      }
    }
    ft_options.committed_step = resumed_step;
    if (o.zero != 0) {
      // HSDP: one replica's state sharded over a group of the node's workers, replicated
      // across the groups by the quorum.
      ft_options.shard_group_size =
          o.ft_shard_group > 0 ? o.ft_shard_group : run.env.local_world_size;
    }
    auto started = worker::FaultTolerance::start(run.env, ft_options,
                                                 {task.model.get(), optimizer_.get(), &*sampler_});
    if (!started) throw std::runtime_error(started.error().message);
    ft_ = std::move(started).value();

    if (o.zero == 0) {
      worker::DdpOptions options = ddp_options(o);
      options.broadcast_parameters = false;  // the quorum equalises replicas (healing)
      ddp_.emplace(task.model, ft_->group(), options);
    } else {
      worker::ShardingOptions sharding = sharding_options(o, task);
      sharding.broadcast_parameters = false;  // the quorum equalises replicas (healing)
      sharding.gather_in_step = false;        // no collective after a step committed
      sharding.replicate_group = &ft_->replicate_group();
      sharded_.emplace(task.model, ft_->shard_group(), sharding);
      if (o.zero == 3 && task.route_unit_forward) task.route_unit_forward(sharded_->unit_forward());
      optimizer_ = task.make_optimizer(sharded_->shard_parameters(), o.lr);
      ft_->set_state({task.model.get(), optimizer_.get(), &*sampler_, &*sharded_});
    }

    // The schedule counts committed steps, planned for the world the job starts with.
    const auto initial_world = static_cast<std::uint64_t>(run.env.world_size);
    const std::int64_t steps_per_epoch = static_cast<std::int64_t>(
        (task.dataset_size + o.batch_size * initial_world - 1) / (o.batch_size * initial_world));
    const double peak_lr = o.scale_lr ? worker::scale_lr_linearly(o.lr, run.env.world_size) : o.lr;
    schedule_ = {peak_lr, o.warmup_steps, o.cosine ? steps_per_epoch * o.epochs : 0, 0.0};
    say("training " + std::to_string(task.dataset_size) + " samples, fault tolerant, " +
        std::to_string(o.batch_size) + " per replica and step, lr " + fixed(peak_lr, 6));
  }

  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  worker::DistributedDataParallel* ddp() override { return ddp_ ? &*ddp_ : nullptr; }
  worker::ShardedDataParallel* sharded() override { return sharded_ ? &*sharded_ : nullptr; }
  std::int64_t committed() const override { return ft_->committed_step(); }

  std::optional<Step> next() override {
    worker::StepSampler& sampler = *sampler_;
    for (;;) {
      if (sampler.epoch_done(1)) {
        say("epoch " + std::to_string(sampler.epoch() + 1) + "/" + std::to_string(options_.epochs) +
            " done at step " + std::to_string(ft_->committed_step()) + " loss " +
            fixed(loss_sum_ / std::max(loss_count_, 1.0), 6));
        loss_sum_ = loss_count_ = 0;
        if (static_cast<std::int64_t>(sampler.epoch()) + 1 >= options_.epochs) return std::nullopt;
        sampler.set_epoch(sampler.epoch() + 1);
      }
      if (options_.max_steps > 0 && ft_->committed_step() >= options_.max_steps) {
        return std::nullopt;
      }
      started_ = std::chrono::steady_clock::now();
      step_ = ft_->begin_step();
      if (step_.finished) {
        say("the other replicas finished the training at step " + std::to_string(step_.step) +
            ": nothing left to train");
        finished_by_others_ = true;
        return std::nullopt;
      }
      if (sampler.epoch_done(step_.size)) {  // healed to where the peers finished the epoch
        (void)ft_->should_commit();
        continue;
      }
      const auto mine = sampler.step(step_.rank, step_.size);
      Step step;
      step.micro_batches.push_back(
          torch::tensor(std::vector<int64_t>(mine.begin(), mine.end()), torch::kLong));
      // The mean over the quorum's samples of the step however they are shared: this
      // replica's loss weighs its share, and DDP divides the sum of the replicas' gradients by
      // their count.
      step.loss_share = static_cast<double>(mine.size()) * step_.size /
                        static_cast<double>(sampler.step_size(step_.size));
      // What the step trains, read before the commit moves the sampler on.
      quorum_samples_.clear();
      if (consumed_.enabled()) {
        for (int r = 0; r < step_.size; ++r) {
          auto part = sampler.step(r, step_.size);
          quorum_samples_.insert(quorum_samples_.end(), part.begin(), part.end());
        }
      }
      epoch_ = sampler.epoch();
      step_samples_ = sampler.step_size(step_.size);
      return step;
    }
  }

  bool commit() override { return ft_->should_commit(); }
  double learning_rate() const override { return schedule_.lr_at(ft_->committed_step() - 1); }

  void applied(double loss_sum, int losses) override {
    const std::int64_t committed = ft_->committed_step();
    consumed_.commit(who_, epoch_, committed, quorum_samples_);
    loss_sum_ += loss_sum;
    loss_count_ += losses;
    throughput_.record(step_samples_, std::chrono::steady_clock::now() - started_);
    if (options_.log_every > 0 && committed % options_.log_every == 0 && step_.rank == 0) {
      say("step " + std::to_string(committed) + " loss " +
          fixed(loss_sum_ / std::max(loss_count_, 1.0), 6) + " step_ms " +
          fixed(throughput_.seconds_per_step() * 1e3, 2) + " quorum " + std::to_string(step_.size));
    }
    if (checkpointer_ && options_.checkpoint_every > 0 && step_.rank == 0 &&
        committed % options_.checkpoint_every == 0) {
      worker::TrainingProgress progress;
      progress.epoch = static_cast<std::int64_t>(sampler_->epoch());
      progress.step = committed;
      progress.epoch_consumed = sampler_->committed();
      progress.world_size = step_.size;
      checkpointer_->save(*task_.model, *optimizer_, progress);
    }
  }

  // A step that did not commit is redone: its gradients go.
  void clear_gradients(bool) override { optimizer_->zero_grad(); }

  int finish() override {
    if (finished_by_others_) return 0;
    // Sharded: the whole parameters for a while, gathered over the shard group (whose workers
    // end together).
    std::optional<worker::ShardedDataParallel::FullParameters> whole;
    if (sharded_) whole.emplace(*sharded_);
    const std::uint64_t digest = parameter_digest(*task_.model);
    const double final_loss = task_.evaluate();
    whole.reset();
    ft_->finish();
    const auto stats = ft_->stats();
    write_result(digest);
    say("parameters digest " + digest_hex(digest) + " at step " +
        std::to_string(ft_->committed_step()) + ", steps lost " + std::to_string(stats.steps_lost) +
        ", communicators built " + std::to_string(stats.rebuilds) + ", heals received " +
        std::to_string(stats.heals_received) +
        (sharded_ ? ", quorums sat out " + std::to_string(stats.quorums_sat_out) : ""));
    say("final loss " + fixed(final_loss, 6));
    return 0;
  }

 private:
  void say(const std::string& line) const {
    std::cout << "[" << who_ << " pid " << ::getpid() << "] " << line << std::endl;
  }

  // Declared in the order they are made; destroyed the other way (the wrappers before the
  // quorum's groups they train on).
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<worker::StepSampler> sampler_;
  std::optional<worker::Checkpointer> checkpointer_;
  std::unique_ptr<worker::FaultTolerance> ft_;
  std::optional<worker::DistributedDataParallel> ddp_;
  std::optional<worker::ShardedDataParallel> sharded_;
  worker::WarmupCosineSchedule schedule_{};
  worker::Throughput throughput_;
  // The step under way, and what it trains.
  worker::FaultTolerance::Step step_{};
  std::vector<std::uint64_t> quorum_samples_;
  std::uint64_t epoch_ = 0;
  std::uint64_t step_samples_ = 0;
  std::chrono::steady_clock::time_point started_;
  double loss_sum_ = 0;
  double loss_count_ = 0;
  bool finished_by_others_ = false;
};

}  // namespace

std::unique_ptr<StepPlan> quorum_step_plan(const TrainOptions& options, Run& run, TrainTask& task) {
  return std::make_unique<QuorumStepPlan>(options, run, task);
}

}  // namespace ctrun::trainers
