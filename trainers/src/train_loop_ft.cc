// The trainers' loop with --fault_tolerant (under ctrun --fault_tolerance=step): every step on
// the quorum FaultTolerance forms, the exact StepSampler, a step that does not commit redone.
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>  // getpid

#include <chrono>
#include <csignal>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <thread>

#include "consumed_log.h"
#include "ctrun/worker/checkpoint.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/fault_tolerance.h"
#include "ctrun/worker/log.h"
#include "ctrun/worker/lr_schedule.h"
#include "ctrun/worker/sampler.h"
#include "ctrun/worker/sharded.h"
#include "ctrun/worker/throughput.h"
#include "train_loop.h"

namespace ctrun::trainers {

using worker::fixed;

namespace {

torch::Tensor zero_loss(const torch::nn::Module& model) {
  torch::Tensor sum;
  for (const auto& p : model.parameters()) {
    sum = sum.defined() ? sum + p.sum() * 0 : p.sum() * 0;
  }
  return sum;
}

void say(const std::string& replica, const std::string& line) {
  std::cout << "[" << replica << " pid " << ::getpid() << "] " << line << std::endl;
}

}  // namespace

int train_fault_tolerant(const TrainOptions& o, Run& run, TrainTask& task) {
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
  const std::string replica = run.env.replica_id;
  // With --zero the optimizer steps the shards, which exist once the shard group does.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (o.zero == 0) optimizer = task.make_optimizer(task.model->parameters(), o.lr);

  worker::SamplerOptions sampler_options;
  sampler_options.dataset_size = task.dataset_size;
  sampler_options.seed = o.seed;
  worker::StepSampler sampler(sampler_options, static_cast<std::uint64_t>(o.batch_size));

  worker::FaultToleranceOptions ft_options;
  ft_options.backend =
      worker::parse_backend(o.backend.empty() ? (o.device == "cuda" ? "nccl" : "gloo") : o.backend);
  ft_options.min_replicas = o.ft_min_replicas;
  ft_options.collective_timeout = std::chrono::milliseconds(o.ft_collective_timeout_ms);
  ft_options.heartbeat_timeout = std::chrono::milliseconds(o.ft_heartbeat_timeout_ms);
  ft_options.join_timeout = std::chrono::milliseconds(o.ft_join_timeout_ms);
  ft_options.quorum_timeout = std::chrono::milliseconds(o.ft_quorum_timeout_ms);

  // A whole-job loss resumes from the last checkpoint; a replica replaced while its peers train
  // on heals from them instead (its checkpoint is older than their step).
  std::optional<worker::Checkpointer> checkpointer;
  std::int64_t resumed_step = 0;
  if (!o.checkpoint_dir.empty()) {
    checkpointer.emplace(o.checkpoint_dir, 0);
    if (auto loaded = checkpointer->load_latest(*task.model, *optimizer)) {
      resumed_step = loaded->step;
      sampler.restore(static_cast<std::uint64_t>(loaded->epoch), loaded->epoch_consumed);
      say(replica, "resumed at step " + std::to_string(resumed_step));
    }
  }
  ft_options.committed_step = resumed_step;
  if (o.zero != 0) {
    // HSDP: one replica's state sharded over a group of the node's workers, replicated across
    // the groups by the quorum.
    ft_options.shard_group_size =
        o.ft_shard_group > 0 ? o.ft_shard_group : run.env.local_world_size;
  }
  auto started = worker::FaultTolerance::start(run.env, ft_options,
                                               {task.model.get(), optimizer.get(), &sampler});
  if (!started) throw std::runtime_error(started.error().message);
  worker::FaultTolerance& ft = *started.value();

  std::optional<worker::DistributedDataParallel> ddp;
  std::optional<worker::ShardedDataParallel> sharded;
  if (o.zero == 0) {
    worker::DdpOptions options = ddp_options(o);
    options.broadcast_parameters = false;  // the quorum equalises replicas (healing)
    ddp.emplace(task.model, ft.group(), options);
  } else {
    worker::ShardingOptions sharding = sharding_options(o, task);
    sharding.broadcast_parameters = false;  // the quorum equalises replicas (healing)
    sharding.gather_in_step = false;        // no collective after a step committed
    sharding.replicate_group = &ft.replicate_group();
    sharded.emplace(task.model, ft.shard_group(), sharding);
    if (o.zero == 3 && task.route_unit_forward) task.route_unit_forward(sharded->unit_forward());
    optimizer = task.make_optimizer(sharded->shard_parameters(), o.lr);
    ft.set_state({task.model.get(), optimizer.get(), &sampler, &*sharded});
  }

  // The schedule counts committed steps, planned for the world the job starts with.
  const auto initial_world = static_cast<std::uint64_t>(run.env.world_size);
  const std::int64_t steps_per_epoch = static_cast<std::int64_t>(
      (task.dataset_size + o.batch_size * initial_world - 1) / (o.batch_size * initial_world));
  const double peak_lr = o.scale_lr ? worker::scale_lr_linearly(o.lr, run.env.world_size) : o.lr;
  worker::WarmupCosineSchedule schedule{peak_lr, o.warmup_steps,
                                        o.cosine ? steps_per_epoch * o.epochs : 0, 0.0};
  ConsumedLog consumed(o.consumed_log);
  worker::Throughput throughput;
  double loss_sum = 0;
  double loss_count = 0;
  say(replica, "training " + std::to_string(task.dataset_size) + " samples, fault tolerant, " +
                   std::to_string(o.batch_size) + " per replica and step, lr " + fixed(peak_lr, 6));

  for (;;) {
    if (sampler.epoch_done(1)) {
      say(replica, "epoch " + std::to_string(sampler.epoch() + 1) + "/" + std::to_string(o.epochs) +
                       " done at step " + std::to_string(ft.committed_step()) + " loss " +
                       fixed(loss_sum / std::max(loss_count, 1.0), 6));
      loss_sum = loss_count = 0;
      if (static_cast<std::int64_t>(sampler.epoch()) + 1 >= o.epochs) break;
      sampler.set_epoch(sampler.epoch() + 1);
    }
    if (o.max_steps > 0 && ft.committed_step() >= o.max_steps) break;
    const auto step_started = std::chrono::steady_clock::now();
    const auto step = ft.begin_step();
    if (step.finished) {
      say(replica, "the other replicas finished the training at step " + std::to_string(step.step) +
                       ": nothing left to train");
      return 0;
    }
    // As without the mode: before step N+1, N steps committed.
    if (ft.committed_step() == o.inject_kill_at_step && run.env.restart_count == 0 &&
        run.env.rank == run.env.world_size - 1) {
      consumed.fault(replica, ft.committed_step());
      std::raise(SIGKILL);
    }
    if (ft.committed_step() == o.inject_hang_at_step && run.env.restart_count == 0 &&
        run.env.rank == run.env.world_size - 1) {
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (sampler.epoch_done(step.size)) {  // healed to where the peers finished the epoch
      (void)ft.should_commit();
      continue;
    }
    const auto mine = sampler.step(step.rank, step.size);
    const auto indices =
        torch::tensor(std::vector<int64_t>(mine.begin(), mine.end()), torch::kLong);
    // The mean over the quorum's samples of the step however they are shared: this replica's
    // loss weighs its share, and DDP divides the sum of the replicas' gradients by their count.
    const double share = static_cast<double>(mine.size()) * step.size /
                         static_cast<double>(sampler.step_size(step.size));
    // A replica with no sample in a short last step still sends (zero) gradients.
    auto forward = [&] {
      if (!mine.empty()) return task.loss(indices) * share;
      // Sharded: through the model's own forward, which gathers what stage 3 needs.
      return sharded ? task.loss(torch::zeros({1}, torch::kLong)) * 0.0 : zero_loss(*task.model);
    };
    torch::Tensor loss = sharded ? sharded->forward(forward) : forward();
    loss.backward();
    if (o.clip_grad_norm > 0) {
      if (sharded) {
        sharded->clip_grad_norm(o.clip_grad_norm);
      } else {
        torch::nn::utils::clip_grad_norm_(task.model->parameters(), o.clip_grad_norm);
      }
    }
    std::vector<std::uint64_t> all;
    if (consumed.enabled()) {
      for (int r = 0; r < step.size; ++r) {
        auto part = sampler.step(r, step.size);
        all.insert(all.end(), part.begin(), part.end());
      }
    }
    const std::uint64_t epoch = sampler.epoch();
    const std::uint64_t step_samples = sampler.step_size(step.size);
    if (ft.should_commit()) {
      const double lr = schedule.lr_at(ft.committed_step() - 1);
      for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
      if (sharded) {
        sharded->step(*optimizer);
      } else {
        optimizer->step();
      }
      consumed.commit(replica, epoch, ft.committed_step(), all);
      if (!mine.empty()) {
        loss_sum += loss.item<double>() / share;
        loss_count += 1;
      }
      throughput.record(step_samples, std::chrono::steady_clock::now() - step_started);
      if (o.log_every > 0 && ft.committed_step() % o.log_every == 0 && step.rank == 0) {
        say(replica, "step " + std::to_string(ft.committed_step()) + " loss " +
                         fixed(loss_sum / std::max(loss_count, 1.0), 6) + " step_ms " +
                         fixed(throughput.seconds_per_step() * 1e3, 2) + " quorum " +
                         std::to_string(step.size));
      }
      if (checkpointer && o.checkpoint_every > 0 && step.rank == 0 &&
          ft.committed_step() % o.checkpoint_every == 0) {
        worker::TrainingProgress progress;
        progress.epoch = static_cast<std::int64_t>(sampler.epoch());
        progress.step = ft.committed_step();
        progress.epoch_consumed = sampler.committed();
        progress.world_size = step.size;
        checkpointer->save(*task.model, *optimizer, progress);
      }
    }
    optimizer->zero_grad();
  }
  // Sharded: the whole parameters for a while, gathered over the shard group (whose workers
  // end together).
  std::optional<worker::ShardedDataParallel::FullParameters> whole;
  if (sharded) whole.emplace(*sharded);
  const std::uint64_t digest = parameter_digest(*task.model);
  const double final_loss = task.evaluate();
  whole.reset();
  ft.finish();
  const auto stats = ft.stats();
  write_result(digest);
  say(replica, "parameters digest " + digest_hex(digest) + " at step " +
                   std::to_string(ft.committed_step()) + ", steps lost " +
                   std::to_string(stats.steps_lost) + ", communicators built " +
                   std::to_string(stats.rebuilds) + ", heals received " +
                   std::to_string(stats.heals_received) +
                   (sharded ? ", quorums sat out " + std::to_string(stats.quorums_sat_out) : ""));
  say(replica, "final loss " + fixed(final_loss, 6));
  return 0;
}

}  // namespace ctrun::trainers
