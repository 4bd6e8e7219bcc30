// Sharded checkpoints: a run saved at one world size and ZeRO stage continues at another
// exactly as if uninterrupted (parameters and Adam's state resharded), whole (DDP) checkpoints
// convert both ways, and a save killed at any moment leaves the previous checkpoint loadable.
#include "ctrun/worker/sharded_checkpoint.h"

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>

#include "catch.h"
#include "ctrun/worker/checkpoint.h"
#include "gloo_ranks.h"
#include "process.h"
#include "sharded_net.h"

using namespace std::chrono_literals;
using namespace ctrun::testing::sharded_net;
using ctrun::testing::run_gloo_ranks;
using ctrun::testing::ScratchDir;
using ctrun::worker::Checkpointer;
using ctrun::worker::ProcessGroup;
using ctrun::worker::ShardedCheckpointer;
using ctrun::worker::ShardedDataParallel;
using ctrun::worker::ShardingOptions;
using ctrun::worker::TrainingProgress;

namespace fs = std::filesystem;

namespace {

constexpr int kRows = 12;  // every step's global batch, whatever the world (12 = 2*6 = 3*4 = 4*3)

// One process on whole batches with torch's Adam, from and to whole checkpoints in `dir` (none
// when empty). Returns the parameters, and Adam's step count for the first one.
std::pair<torch::Tensor, std::int64_t> train_whole(int steps, const std::string& dir) {
  auto model = make_model(100);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
  int step = 0;
  if (!dir.empty()) {
    if (auto loaded = Checkpointer(dir, 0).load_latest(*model, opt)) step = loaded->step;
  }
  for (const int end = step + steps; step < end; ++step) {
    auto [x, y] = global_batch(step, kRows);
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
  if (!dir.empty()) {
    TrainingProgress progress;
    progress.step = step;
    Checkpointer(dir, 0).save(*model, opt, progress);
  }
  const auto& state = opt.state();
  const auto found = std::find_if(state.begin(), state.end(), [](const auto&) { return true; });
  const std::int64_t adam_steps =
      found == state.end()
          ? 0
          : static_cast<const torch::optim::AdamParamState&>(*found->second).step();
  return {flat_parameters(*model), adam_steps};
}

// `steps` steps at `world` ranks and ZeRO `stage`, resuming from the newest checkpoint in `dir`
// and saving at the end. Returns the step each rank resumed at.
std::vector<int> train_sharded(int world, int stage, int steps, const std::string& dir) {
  return run_gloo_ranks<int>(world, [&](int rank, ProcessGroup& group) {
    auto model = make_model(100 + rank);
    ShardingOptions options;
    options.stage = stage;
    options.units = {model->block0.ptr(), model->block1.ptr()};
    options.unit_bytes = 4000;
    ShardedDataParallel sharded(model.ptr(), group, options);
    model->run_unit = sharded.unit_forward();
    torch::optim::Adam opt(sharded.shard_parameters(), torch::optim::AdamOptions(0.01));
    ShardedCheckpointer checkpointer(dir);
    const auto loaded = checkpointer.load_latest(sharded, opt);
    const int resumed = loaded ? static_cast<int>(loaded->step) : 0;
    const int rows = kRows / world;
    for (int step = resumed; step < resumed + steps; ++step) {
      auto [x, y] = global_batch(step, kRows);
      sharded
          .forward([&] {
            return torch::mse_loss(model->forward(x.slice(0, rank * rows, (rank + 1) * rows)),
                                   y.slice(0, rank * rows, (rank + 1) * rows));
          })
          .backward();
      sharded.step(opt);
    }
    TrainingProgress progress;
    progress.step = resumed + steps;
    progress.world_size = world;
    checkpointer.save(sharded, opt, progress);
    return resumed;
  });
}

void check_close(const torch::Tensor& a, const torch::Tensor& b) {
  const double max_diff = (a - b).abs().max().item<double>();
  INFO("max |resumed - uninterrupted| = " << max_diff);
  CHECK(max_diff < 1e-5);
}

}  // namespace

TEST_CASE("sharded checkpoint: 3 ranks at stage 3, then 2 at stage 2, then 4 at stage 1") {
  at::set_num_threads(1);
  ScratchDir dir("sharded_reshard");
  CHECK(train_sharded(3, 3, 3, dir.path()) == std::vector<int>(3, 0));
  CHECK(train_sharded(2, 2, 3, dir.path()) == std::vector<int>(2, 3));
  CHECK(train_sharded(4, 1, 2, dir.path()) == std::vector<int>(4, 6));
  // A directory per checkpoint, a file per rank of the world that wrote it; two kept.
  CHECK(fs::exists(dir.path() + "/checkpoint-8/shard-3.bin"));
  CHECK(fs::exists(dir.path() + "/checkpoint-8/metadata.json"));
  CHECK(fs::exists(dir.path() + "/checkpoint-6/shard-1.bin"));
  CHECK_FALSE(fs::exists(dir.path() + "/checkpoint-3"));
  // Read whole by Checkpointer (a DDP run's loader), with Adam's state, and continued: the same
  // as 10 uninterrupted steps.
  const auto resumed = train_whole(2, dir.path());
  const auto uninterrupted = train_whole(10, "");
  check_close(resumed.first, uninterrupted.first);
  CHECK(resumed.second == 10);
  CHECK((uninterrupted.first - train_whole(0, "").first).abs().max().item<double>() > 1e-2);
}

TEST_CASE("sharded checkpoint: a whole (DDP) checkpoint converts to sharded and back") {
  at::set_num_threads(1);
  ScratchDir dir("sharded_convert");
  train_whole(3, dir.path());  // checkpoint-3.pt
  CHECK(train_sharded(2, 3, 3, dir.path()) == std::vector<int>(2, 3));
  CHECK(fs::exists(dir.path() + "/checkpoint-6/shard-1.bin"));
  const auto resumed = train_whole(2, dir.path());  // from checkpoint-6, to checkpoint-8.pt
  check_close(resumed.first, train_whole(8, "").first);
  CHECK(resumed.second == 8);
}

TEST_CASE("sharded checkpoint: one that does not read back is skipped for the one before") {
  at::set_num_threads(1);
  ScratchDir dir("sharded_torn");
  train_sharded(2, 3, 2, dir.path());
  train_sharded(2, 3, 2, dir.path());  // checkpoint-2 and checkpoint-4
  fs::resize_file(dir.path() + "/checkpoint-4/shard-1.bin", 100);
  CHECK(train_sharded(3, 3, 1, dir.path()) == std::vector<int>(3, 2));
  // And a model whose shapes differ finds no checkpoint it can use.
  fs::create_directories(dir.path() + "/checkpoint-9");
  std::ofstream(dir.path() + "/checkpoint-9/metadata.json") << "{\"format\": \"something else\"}";
  auto other = std::make_shared<torch::nn::LinearImpl>(3, 3);
  torch::optim::Adam opt(other->parameters());
  CHECK_FALSE(Checkpointer(dir.path(), 0).load_latest(*other, opt));
}

TEST_CASE("sharded checkpoint: SIGKILL during a save leaves the previous checkpoint loadable") {
  ScratchDir dir("sharded_kill");
  std::mt19937 rng(4321);
  for (int round = 0; round < 6; ++round) {
    ctrun::testing::ChildProcess writer({CHECKPOINT_WRITER_PATH, dir.path(), "sharded"},
                                        dir.path() + "/writer.log");
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (Checkpointer(dir.path(), 0).list().empty() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
    writer.signal(SIGKILL);
    REQUIRE(writer.wait(10s) == 128 + SIGKILL);
    // Every value is the step it was saved at: read whole, and resharded to 3 ranks.
    auto model = std::make_shared<torch::nn::LinearImpl>(1024, 1024);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    auto back = Checkpointer(dir.path(), 0).load_latest(*model, opt);
    REQUIRE(back);
    INFO("round " << round << ": loaded step " << back->step);
    CHECK(torch::all(model->weight == static_cast<double>(back->step)).item<bool>());
    CHECK(torch::all(model->bias == static_cast<double>(back->step)).item<bool>());
    const auto sharded_steps = run_gloo_ranks<std::int64_t>(3, [&](int, ProcessGroup& group) {
      auto resharded = std::make_shared<torch::nn::LinearImpl>(1024, 1024);
      ShardingOptions options;
      options.stage = 2;
      options.broadcast_parameters = false;
      ShardedDataParallel sharded(resharded, group, options);
      torch::optim::SGD sgd(sharded.shard_parameters(), torch::optim::SGDOptions(0.1));
      auto loaded = ShardedCheckpointer(dir.path()).load_latest(sharded, sgd);
      const bool whole =
          torch::all(resharded->weight == static_cast<double>(loaded->step)).item<bool>();
      return whole ? loaded->step : -1;
    });
    CHECK(sharded_steps == std::vector<std::int64_t>(3, back->step));
    ctrun::testing::remove_tree(dir.path());
    fs::create_directories(dir.path());
  }
}
