#include "train_loop.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>
#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <thread>

#include "consumed_log.h"
#include "ctrun/worker/checkpoint.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/heartbeat.h"
#include "ctrun/worker/log.h"
#include "ctrun/worker/lr_schedule.h"
#include "ctrun/worker/malloc_tuning.h"
#include "ctrun/worker/sampler.h"
#include "ctrun/worker/sharded_checkpoint.h"
#include "ctrun/worker/throughput.h"

namespace ctrun::trainers {

using worker::fixed;
using worker::log_rank0;

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

namespace {

// DDP's promise, checked once at the end: every rank holds bit-identical parameters (with
// --zero, the whole ones it gathers).
void check_replicas(Run& run, const torch::nn::Module& model) {
  const std::uint64_t digest = parameter_digest(model);
  const auto gathered = run.group->all_gather(
      torch::tensor({static_cast<int64_t>(digest)}, torch::kLong).to(run.device));
  for (std::size_t r = 0; r < gathered.size(); ++r) {
    if (gathered[r].item<int64_t>() != static_cast<int64_t>(digest)) {
      throw std::runtime_error("parameters differ between rank " + std::to_string(run.env.rank) +
                               " and rank " + std::to_string(r) + " after training");
    }
  }
  log_rank0(run.env.rank, "parameters identical on all " + std::to_string(gathered.size()) +
                              " rank(s), digest " + digest_hex(digest));
  write_result(digest);
}

}  // namespace

void write_result(std::uint64_t digest) {
  if (const char* path = std::getenv("CTRUN_RESULT_FILE"); path && *path) {
    std::ofstream(path) << digest_hex(digest) << "\n";
  }
}

int train(const TrainOptions& o, Run& run, TrainTask& task) {
  if (o.fault_tolerant) return train_fault_tolerant(o, run, task);
  const int rank = run.env.rank;
  const int world = run.env.world_size;
  if (o.zero != 0 && o.no_ddp) throw std::invalid_argument("--zero and --no_ddp: choose one");
  std::int64_t parameter_count = 0;  // counted before a sharded wrapper takes them apart
  for (const auto& p : task.model->parameters()) parameter_count += p.numel();
  // Before the optimizer: with --zero it steps the shards the wrapper makes.
  std::optional<worker::ShardedDataParallel> sharded;
  if (o.zero != 0) {
    sharded.emplace(task.model, *run.group, sharding_options(o, task));
    if (o.zero == 3 && task.route_unit_forward) task.route_unit_forward(sharded->unit_forward());
  }
  auto optimizer =
      task.make_optimizer(sharded ? sharded->shard_parameters() : task.model->parameters(), o.lr);

  // Whole checkpoints (rank 0 writes) for a replicated model, sharded ones (every rank writes
  // its shards) with --zero; each kind resumes from the other.
  std::optional<worker::Checkpointer> whole_checkpointer;
  std::optional<worker::ShardedCheckpointer> sharded_checkpointer;
  const bool checkpointing = !o.checkpoint_dir.empty();
  auto save_checkpoint = [&](const worker::TrainingProgress& at) {
    if (sharded) {
      sharded_checkpointer->save(*sharded, *optimizer, at);
    } else {
      whole_checkpointer->save(*task.model, *optimizer, at);
    }
  };
  worker::TrainingProgress progress;
  progress.world_size = world;
  if (checkpointing) {
    if (sharded) {
      sharded_checkpointer.emplace(o.checkpoint_dir);
    } else {
      whole_checkpointer.emplace(o.checkpoint_dir, rank);
    }
    auto loaded = sharded ? sharded_checkpointer->load_latest(*sharded, *optimizer)
                          : whole_checkpointer->load_latest(*task.model, *optimizer);
    if (loaded) {
      log_rank0(rank, "resumed at step " + std::to_string(loaded->step) + " (epoch " +
                          std::to_string(loaded->epoch + 1) + ", written by a world of " +
                          std::to_string(loaded->world_size) + ", now " + std::to_string(world) +
                          ")");
      progress = *loaded;
      progress.world_size = world;
    }
  }

  if (o.no_ddp && world != 1) {
    throw std::invalid_argument(
        "--no_ddp trains one replica alone: it needs a world size of 1, got " +
        std::to_string(world));
  }
  std::optional<worker::DistributedDataParallel> ddp;
  if (!o.no_ddp && !sharded) ddp.emplace(task.model, *run.group, ddp_options(o));

  worker::SamplerOptions sampler_options;
  sampler_options.dataset_size = task.dataset_size;
  sampler_options.seed = o.seed;
  worker::DistributedSampler sampler(sampler_options, rank, world);

  const std::int64_t samples_per_step = static_cast<std::int64_t>(o.batch_size) * o.grad_accum;
  sampler.set_epoch(0);
  const std::int64_t steps_per_epoch =
      (static_cast<std::int64_t>(sampler.num_samples()) + samples_per_step - 1) / samples_per_step;
  const double peak_lr = o.scale_lr ? worker::scale_lr_linearly(o.lr, world) : o.lr;
  worker::WarmupCosineSchedule schedule{peak_lr, o.warmup_steps,
                                        o.cosine ? steps_per_epoch * o.epochs : 0, 0.0};
  log_rank0(rank, "training " + std::to_string(parameter_count) + " parameters on " +
                      std::to_string(task.dataset_size) + " samples, " + std::to_string(world) +
                      " rank(s), " + std::to_string(o.batch_size) + " per rank x " +
                      std::to_string(o.grad_accum) + " micro-steps, " +
                      (ddp       ? std::to_string(ddp->buckets().size()) + " gradient bucket(s)"
                       : sharded ? "ZeRO stage " + std::to_string(o.zero) + ", " +
                                       std::to_string(sharded->unit_count()) + " unit(s)"
                                 : std::string("no DDP")) +
                      ", lr " + fixed(peak_lr, 6));

  worker::Throughput throughput;
  ConsumedLog consumed(o.consumed_log);
  const std::string who = "rank" + std::to_string(rank);
  bool stop = false;
  for (std::int64_t epoch = progress.epoch; epoch < o.epochs && !stop; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    if (epoch == progress.epoch) sampler.set_consumed(progress.epoch_consumed);
    const std::uint64_t start_consumed = sampler.consumed();
    const std::vector<std::uint64_t> mine = sampler.indices();
    const auto all = torch::tensor(std::vector<int64_t>(mine.begin(), mine.end()), torch::kLong);
    double loss_sum = progress.values["loss_sum"];
    double loss_count = progress.values["loss_count"];
    std::int64_t pos = 0;
    const auto n = static_cast<std::int64_t>(mine.size());
    auto save_mid_epoch = [&] {
      progress.epoch = epoch;
      progress.epoch_consumed = start_consumed + static_cast<std::uint64_t>(pos) * world;
      progress.values = {{"loss_sum", loss_sum}, {"loss_count", loss_count}};
      save_checkpoint(progress);
    };
    while (pos < n) {
      if (o.max_steps > 0 && progress.step >= o.max_steps) {
        stop = true;
        break;
      }
      if (progress.step == o.inject_kill_at_step && run.env.restart_count == 0 &&
          rank == world - 1) {
        consumed.fault(who, progress.step);
        std::raise(SIGKILL);
      }
      if (progress.step == o.inject_hang_at_step && run.env.restart_count == 0 &&
          rank == world - 1) {
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      const auto started = std::chrono::steady_clock::now();
      const std::int64_t step_begin = pos;
      const std::int64_t step_end = std::min(n, pos + samples_per_step);
      const std::int64_t micro_steps = (step_end - pos + o.batch_size - 1) / o.batch_size;
      for (; pos < step_end; pos += o.batch_size) {
        const std::int64_t end = std::min(step_end, pos + o.batch_size);
        const bool last = end == step_end;
        const torch::Tensor indices = all.slice(0, pos, end);
        torch::Tensor loss =
            sharded ? sharded->forward([&] { return task.loss(indices); }) : task.loss(indices);
        loss_sum += loss.item<double>();
        loss_count += 1;
        // The step's gradient is the mean over its micro-steps.
        if (micro_steps > 1) loss = loss / static_cast<double>(micro_steps);
        // Every micro-step but the last only accumulates locally.
        if (last) {
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
      const double lr = schedule.lr_at(progress.step);
      for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
      if (sharded) {
        sharded->step(*optimizer);  // also clears the shards' gradients
      } else {
        optimizer->step();
        optimizer->zero_grad();
      }
      ++progress.step;
      ctrun::worker::report_step(progress.step);  // ctrun --faults at a step
      if (consumed.enabled()) {
        consumed.commit(who, static_cast<std::uint64_t>(epoch), progress.step,
                        {mine.begin() + step_begin, mine.begin() + step_end});
      }
      throughput.record(static_cast<std::uint64_t>(micro_steps * o.batch_size),
                        std::chrono::steady_clock::now() - started);
      if (o.log_every > 0 && progress.step % o.log_every == 0) {
        log_rank0(rank, "step " + std::to_string(progress.step) + " loss " +
                            fixed(loss_sum / std::max(loss_count, 1.0), 6) + " step_ms " +
                            fixed(throughput.seconds_per_step() * 1e3, 2) + " samples/s " +
                            fixed(throughput.samples_per_second() * world, 1));
      }
      if (checkpointing && o.checkpoint_every > 0 && progress.step % o.checkpoint_every == 0 &&
          pos < n) {
        save_mid_epoch();
      }
    }
    if (stop) {
      // Stopped by --max_steps mid-epoch: a later run with a larger limit continues from here.
      if (checkpointing) save_mid_epoch();
      break;
    }
    log_rank0(rank, "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o.epochs) +
                        " loss " + fixed(loss_sum / std::max(loss_count, 1.0), 6) + " samples/s " +
                        fixed(throughput.samples_per_second() * world, 1));
    progress.epoch = epoch + 1;
    progress.epoch_consumed = 0;
    progress.values = {{"loss_sum", 0.0}, {"loss_count", 0.0}};
    if (checkpointing) save_checkpoint(progress);
  }
  double final_loss = 0;
  if (sharded) {
    {
      auto whole = sharded->full_parameters();
      check_replicas(run, *task.model);
    }
    // Through the wrapper, which gathers one unit at a time.
    final_loss = sharded->forward([&] { return torch::tensor(task.evaluate(), torch::kDouble); })
                     .item<double>();
  } else {
    check_replicas(run, *task.model);
    final_loss = task.evaluate();
  }
  log_rank0(rank, "final loss " + fixed(final_loss, 6) + " after " + std::to_string(progress.step) +
                      " steps, samples/s " + fixed(throughput.samples_per_second() * world, 1));
  return 0;
}

}  // namespace ctrun::trainers
