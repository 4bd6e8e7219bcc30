#include "train_options.h"

namespace ctrun::trainers {

void add_train_options(CLI::App& app, TrainOptions& o) {
  app.add_option("--epochs", o.epochs, "Passes over the dataset")->check(CLI::PositiveNumber);
  app.add_option("--batch_size", o.batch_size, "Samples per rank per micro-step")
      ->check(CLI::PositiveNumber);
  app.add_option("--grad_accum", o.grad_accum, "Micro-steps per optimizer step (no_sync between)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "Learning rate (for one worker when --scale_lr)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--scale_lr", o.scale_lr, "Scale the learning rate linearly with the world size");
  app.add_option("--warmup_steps", o.warmup_steps, "Linear warmup over this many steps")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--cosine", o.cosine, "Cosine decay to 0 after warmup, over the whole run");
  app.add_option("--clip_grad_norm", o.clip_grad_norm, "Clip gradients to this global norm")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint_dir", o.checkpoint_dir, "Resume from and save checkpoints here");
  app.add_option("--checkpoint_every", o.checkpoint_every,
                 "Save every N optimizer steps (and at every epoch end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device", o.device, "cpu or cuda (cuda:LOCAL_RANK)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--backend", o.backend, "gloo or nccl (default: gloo on cpu, nccl on cuda)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--seed", o.seed, "Seed for data, initialisation and shuffling");
  app.add_option("--max_steps", o.max_steps, "Stop after this many optimizer steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--first_bucket_mb", o.first_bucket_mb, "DDP's first gradient bucket, MB")
      ->check(CLI::PositiveNumber);
  app.add_option("--bucket_mb", o.bucket_mb, "DDP's other gradient buckets, MB")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no_overlap", o.no_overlap,
               "One all-reduce after backward instead of bucketed overlap (for measuring)");
  app.add_flag("--no_ddp", o.no_ddp,
               "Train the model without DistributedDataParallel (world size 1 only; the "
               "baseline that measures DDP's overhead)");
  app.add_option("--zero", o.zero,
                 "Shard the training state (ZeRO): 1 optimizer state, 2 and gradients, 3 and "
                 "parameters; 0 replicates it (DDP)")
      ->check(CLI::Range(0, 3));
  app.add_option("--optimizer_kernel", o.optimizer_kernel,
                 "How Adam/AdamW step: fused (_fused_adam(w)_), foreach, loop (torch's), or "
                 "auto (fused where this LibTorch has it for the device, else foreach)")
      ->check(CLI::IsMember({"auto", "fused", "foreach", "loop"}));
  app.add_flag("--find_unused_parameters", o.find_unused_parameters,
               "Allow parameters that get no gradient in a step");
  app.add_option("--log_every", o.log_every, "Print step time and samples/s every N steps")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", o.timeout_s, "Seconds a collective may wait for a peer")
      ->check(CLI::PositiveNumber);
  app.add_option("--inject_kill_at_step", o.inject_kill_at_step,
                 "Fault injection: on the first attempt the last rank SIGKILLs itself before "
                 "this optimizer step");
  app.add_option("--inject_hang_at_step", o.inject_hang_at_step,
                 "Fault injection: on the first attempt the last rank stops making progress "
                 "(sleeps forever) before this optimizer step");
  app.add_flag("--fault_tolerant", o.fault_tolerant,
               "Per-step fault tolerance (run under ctrun --fault_tolerance=step): a failure "
               "costs one step; survivors go on, a replaced replica heals from a peer");
  app.add_option("--ft_min_replicas", o.ft_min_replicas, "Fewest replicas a step may train on")
      ->check(CLI::PositiveNumber);
  app.add_option("--ft_shard_group", o.ft_shard_group,
                 "With --zero: the workers (local ranks of one node) that shard one replica's "
                 "state; the quorum replicates it across such groups (default: all of the "
                 "node's workers)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ft_collective_timeout_ms", o.ft_collective_timeout_ms,
                 "How long a collective waits for a dead or stuck peer")
      ->check(CLI::PositiveNumber);
  app.add_option("--ft_heartbeat_timeout_ms", o.ft_heartbeat_timeout_ms,
                 "A replica silent this long is dead to the quorum")
      ->check(CLI::PositiveNumber);
  app.add_option("--ft_join_timeout_ms", o.ft_join_timeout_ms,
                 "How long the quorum waits for a member that has not asked")
      ->check(CLI::PositiveNumber);
  app.add_option("--ft_quorum_timeout_ms", o.ft_quorum_timeout_ms,
                 "How long a replica waits for a quorum before it stops")
      ->check(CLI::PositiveNumber);
  app.add_option("--consumed_log", o.consumed_log,
                 "Append each committed step's samples (and an injected fault) to this file");
}

}  // namespace ctrun::trainers
