// Test helper: saves checkpoints of a ~4 MB model in a loop until killed. Checkpoint s has every
// parameter equal to s, so a reader can tell a whole checkpoint from a torn one.
//   checkpoint_writer DIR           whole checkpoints (Checkpointer)
//   checkpoint_writer DIR sharded   sharded ones, by 2 ranks (threads) at ZeRO stage 3
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>

#include "ctrun/worker/checkpoint.h"
#include "ctrun/worker/sharded_checkpoint.h"
#include "gloo_ranks.h"

namespace {

int write_sharded(const std::string& dir) {
  ctrun::testing::run_gloo_ranks<int>(2, [&](int rank, ctrun::worker::ProcessGroup& group) {
    auto model = std::make_shared<torch::nn::LinearImpl>(1024, 1024);
    ctrun::worker::ShardingOptions options;
    options.stage = 3;
    ctrun::worker::ShardedDataParallel sharded(model, group, options);
    torch::optim::SGD opt(sharded.shard_parameters(), torch::optim::SGDOptions(0.1));
    ctrun::worker::ShardedCheckpointer checkpointer(dir);
    for (std::int64_t step = 1;; ++step) {
      torch::NoGradGuard no_grad;
      for (auto& shard : sharded.shard_parameters()) shard.fill_(static_cast<double>(step));
      ctrun::worker::TrainingProgress progress;
      progress.step = step;
      checkpointer.save(sharded, opt, progress);
      if (rank == 0) {
        std::printf("saved %lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
    }
    return 0;
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[2]) == "sharded") return write_sharded(argv[1]);
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer DIR [sharded]\n");
    return 2;
  }
  auto model = std::make_shared<torch::nn::LinearImpl>(1024, 1024);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  ctrun::worker::Checkpointer checkpointer(argv[1], 0);
  for (std::int64_t step = 1;; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.fill_(static_cast<double>(step));
    }
    ctrun::worker::TrainingProgress progress;
    progress.step = step;
    checkpointer.save(*model, opt, progress);
    std::printf("saved %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
}
