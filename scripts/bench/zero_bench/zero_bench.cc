// zero_bench: one rank of a gpt training run under ctrun, replicated (DDP, --zero 0) or sharded
// at a ZeRO stage, that measures its CPU tensor memory through a counting allocator and times
// its steps. Rank 0 prints one JSON line (scripts/bench/zero_bench.py runs and compares them):
//   state_bytes  tensor bytes held right after backward (parameters + gradients + optimizer
//                state + the batch) once they settle, the largest over the measured steps
//   peak_bytes   the most held at any moment of a step (adds activations and what a stage
//                gathers for the moment)
// both less what was held before the model was built, the largest over the ranks, and the
// median step time (not counting the wait for the state to settle).
//   ctrun --standalone --nproc_per_node=2 zero_bench --zero 3 --width 256 --layers 8
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>

#include "counting_allocator.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"
#include "ctrun/worker/sharded.h"
#include "src/gpt_model.h"

namespace {

// The bytes held once they stop changing: c10d's Gloo worker threads drop their references to a
// finished collective's buffers a moment after the collective's waiter wakes, and those
// transients are not the training state being measured (they count in peak_bytes). Bounded.
std::int64_t settled_live_bytes() {
  std::int64_t last = ctrun::bench::cpu_bytes_live();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const std::int64_t now = ctrun::bench::cpu_bytes_live();
    if (now == last && i >= 4) break;
    last = now;
  }
  return last;
}

}  // namespace

int main(int argc, char** argv) {
  ctrun::bench::install_counting_cpu_allocator();  // before any tensor
  CLI::App app{"ZeRO memory and step time of one gpt rank under ctrun", "zero_bench"};
  int zero = 0;
  ctrun::trainers::GptConfig config;
  config.width = 256;
  config.layers = 8;
  config.context = 32;
  int batch = 2;
  int steps = 6;
  bool bf16 = false;
  app.add_option("--zero", zero, "0 (DDP), 1, 2 or 3")->check(CLI::Range(0, 3));
  app.add_option("--width", config.width)->check(CLI::PositiveNumber);
  app.add_option("--layers", config.layers)->check(CLI::PositiveNumber);
  app.add_option("--heads", config.heads)->check(CLI::PositiveNumber);
  app.add_option("--context", config.context)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "Sequences per rank per step")->check(CLI::PositiveNumber);
  app.add_flag("--bf16", bf16, "Sharded stages: bf16 parameters and gradients, fp32 masters");
  app.add_option("--steps", steps, "Steps (the first two are not measured)")
      ->check(CLI::Range(3, 100000));
  CLI11_PARSE(app, argc, argv);
  auto env = ctrun::worker::read_worker_env(ctrun::worker::process_environment());
  if (!env) {
    std::cerr << "zero_bench: " << env.error().message << std::endl;
    return 2;
  }
  auto group = ctrun::worker::init_process_group(env.value());
  const std::int64_t before = ctrun::bench::cpu_bytes_live();

  torch::manual_seed(0);
  auto model = ctrun::trainers::Gpt(config);
  std::int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  std::optional<ctrun::worker::DistributedDataParallel> ddp;
  std::optional<ctrun::worker::ShardedDataParallel> sharded;
  if (zero == 0) {
    ddp.emplace(model.ptr(), *group);
  } else {
    ctrun::worker::ShardingOptions options;
    options.stage = zero;
    if (bf16) options.param_dtype = at::kBFloat16;
    for (const auto& block : model->blocks()) options.units.push_back(block.ptr());
    sharded.emplace(model.ptr(), *group, options);
    model->set_unit_forward(sharded->unit_forward());
  }
  torch::optim::AdamW optimizer(sharded ? sharded->shard_parameters() : model->parameters(),
                                torch::optim::AdamWOptions(1e-4));

  std::int64_t state_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::vector<double> step_ms;
  for (int step = 0; step < steps; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * step + env.value().rank);
    const auto tokens = at::randint(0, config.vocab, {batch, config.context + 1}, generator);
    ctrun::bench::reset_cpu_peak();
    const auto started = std::chrono::steady_clock::now();
    auto loss_of = [&] {
      const auto logits = model->forward(tokens.slice(1, 0, -1));
      return torch::nn::functional::cross_entropy(logits.reshape({-1, config.vocab}).to(at::kFloat),
                                                  tokens.slice(1, 1).reshape({-1}));
    };
    (sharded ? sharded->forward(loss_of) : loss_of()).backward();
    const auto backward_done = std::chrono::steady_clock::now();
    const std::int64_t after_backward = settled_live_bytes() - before;
    const auto step_started = std::chrono::steady_clock::now();
    if (sharded) {
      sharded->step(optimizer);
    } else {
      optimizer.step();
      optimizer.zero_grad();
    }
    const double ms =
        std::chrono::duration<double, std::milli>(backward_done - started +
                                                  (std::chrono::steady_clock::now() - step_started))
            .count();
    if (step < 2) continue;  // the optimizer's state exists from the first step on
    state_bytes = std::max(state_bytes, after_backward);
    peak_bytes = std::max(peak_bytes, ctrun::bench::cpu_bytes_peak() - before);
    step_ms.push_back(ms);
  }
  // The largest over the ranks (padding makes them differ by a few elements).
  auto worst = torch::tensor({state_bytes, peak_bytes}, torch::kLong);
  const auto all = group->all_gather(worst);
  for (const auto& rank : all) worst = torch::max(worst, rank);
  std::sort(step_ms.begin(), step_ms.end());
  if (env.value().rank == 0) {
    std::cout << "ZERO_BENCH {\"zero\": " << zero << ", \"bf16\": " << (bf16 && zero > 0)
              << ", \"world\": " << group->size() << ", \"parameters\": " << parameters
              << ", \"state_bytes\": " << worst[0].item<std::int64_t>()
              << ", \"peak_bytes\": " << worst[1].item<std::int64_t>()
              << ", \"step_ms\": " << step_ms[step_ms.size() / 2] << "}" << std::endl;
  }
  return 0;
}
