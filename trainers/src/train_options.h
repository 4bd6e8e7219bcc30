// The options every trainer shares (the seeds' training-script flags), parsed with CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace ctrun::trainers {

struct TrainOptions {
  int epochs = 3;
  int batch_size = 64;  // per rank, per micro-step
  int grad_accum = 1;   // micro-steps per optimizer step
  double lr = 1e-3;
  bool scale_lr = false;  // multiply lr by the world size (linear scaling rule)
  std::int64_t warmup_steps = 0;
  bool cosine = false;          // cosine decay to 0 over the run after warmup
  double clip_grad_norm = 0.0;  // 0: no clipping
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;  // optimizer steps between saves; 0: at epoch ends only
  std::string device = "cpu";
  std::string backend;  // empty: gloo on cpu, nccl on cuda
  std::uint64_t seed = 0;
  std::int64_t max_steps = 0;  // stop after this many optimizer steps (benchmarks); 0: no limit
  double first_bucket_mb = 1.0;
  double bucket_mb = 25.0;
  bool no_overlap = false;  // one all-reduce after backward instead of bucketed overlap
  bool find_unused_parameters = false;
  bool no_ddp = false;  // the model alone, no DDP (world size 1): the baseline for its overhead
  int zero = 0;         // 1-3: ShardedDataParallel at this ZeRO stage instead of DDP
  std::string optimizer_kernel = "auto";  // Adam(W)'s kernels: auto, fused, foreach, loop
  int log_every = 0;  // print step timing every N optimizer steps; 0: per epoch only
  int timeout_s = 1800;
  std::int64_t inject_kill_at_step = -1;  // fault injection: the last rank SIGKILLs itself
  std::int64_t inject_hang_at_step = -1;  // fault injection: the last rank sleeps forever
  // Per-step fault tolerance (under ctrun --fault_tolerance=step) and its timeouts; a file where
  // each committed step's samples are written (consumed_log.h).
  bool fault_tolerant = false;
  int ft_min_replicas = 1;
  int ft_shard_group = 0;  // with --zero: workers per shard group (0: LOCAL_WORLD_SIZE)
  std::int64_t ft_collective_timeout_ms = 30000;
  std::int64_t ft_heartbeat_timeout_ms = 5000;
  std::int64_t ft_join_timeout_ms = 60000;
  std::int64_t ft_quorum_timeout_ms = 300000;
  std::string consumed_log;
};

void add_train_options(CLI::App& app, TrainOptions& options);

}  // namespace ctrun::trainers
