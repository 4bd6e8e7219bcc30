// Test helper: saves checkpoints of a ~4 MB model in a loop until killed. Checkpoint s has every
// parameter equal to s, so a reader can tell a whole checkpoint from a torn one.
//   checkpoint_writer DIR
#include <torch/torch.h>

#include <cstdio>

#include "ctrun/worker/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_writer DIR\n");
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
