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
}

}  // namespace ctrun::trainers
