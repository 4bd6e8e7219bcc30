#include "ctrun/worker/checkpoint.h"

#include <signal.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "catch.h"
#include "process.h"

using namespace std::chrono_literals;
using ctrun::testing::ScratchDir;
using ctrun::worker::Checkpointer;
using ctrun::worker::TrainingProgress;
namespace fs = std::filesystem;

namespace {

struct Trained {
  std::shared_ptr<torch::nn::SequentialImpl> model;
  std::unique_ptr<torch::optim::Adam> opt;
};

Trained make_trained(int steps) {
  torch::manual_seed(3);
  Trained t;
  t.model =
      std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(4, 8), torch::nn::Linear(8, 2));
  t.opt =
      std::make_unique<torch::optim::Adam>(t.model->parameters(), torch::optim::AdamOptions(0.1));
  for (int i = 0; i < steps; ++i) {
    t.opt->zero_grad();
    t.model->forward(torch::randn({3, 4})).sum().backward();
    t.opt->step();
  }
  return t;
}

}  // namespace

TEST_CASE("checkpoint: model, optimizer, progress and RNG come back") {
  ScratchDir dir("ckpt_roundtrip");
  Trained saved = make_trained(3);
  TrainingProgress progress;
  progress.epoch = 2;
  progress.step = 17;
  progress.epoch_consumed = 640;
  progress.world_size = 4;
  progress.values = {{"loss_sum", 12.5}};
  Checkpointer(dir.path(), 0).save(*saved.model, *saved.opt, progress);
  Checkpointer(dir.path(), 1).save(*saved.model, *saved.opt, TrainingProgress{});  // rank 1: no-op
  const auto after_save = torch::randn({5});
  const auto saved_params = saved.model->parameters();

  Trained loaded = make_trained(0);
  auto back = Checkpointer(dir.path(), 1).load_latest(*loaded.model, *loaded.opt);
  REQUIRE(back);
  CHECK(back->epoch == 2);
  CHECK(back->step == 17);
  CHECK(back->epoch_consumed == 640);
  CHECK(back->world_size == 4);
  CHECK(back->values.at("loss_sum") == 12.5);
  CHECK(torch::equal(torch::randn({5}), after_save));  // the generator resumes where it was
  for (std::size_t i = 0; i < saved_params.size(); ++i) {
    CHECK(torch::equal(loaded.model->parameters()[i], saved_params[i]));
  }
  // The optimizer state came too: one more identical step keeps both identical.
  for (Trained* t : {&saved, &loaded}) {
    torch::manual_seed(9);
    t->opt->zero_grad();
    t->model->forward(torch::randn({3, 4})).sum().backward();
    t->opt->step();
  }
  for (std::size_t i = 0; i < saved_params.size(); ++i) {
    CHECK(torch::equal(loaded.model->parameters()[i], saved.model->parameters()[i]));
  }
}

TEST_CASE("checkpoint: keeps the newest ones and skips one that does not read back") {
  ScratchDir dir("ckpt_keep");
  Trained t = make_trained(1);
  Checkpointer checkpointer(dir.path(), 0, 2);
  CHECK_FALSE(checkpointer.load_latest(*t.model, *t.opt));  // none yet
  for (int step : {5, 10, 15, 20}) {
    TrainingProgress p;
    p.step = step;
    checkpointer.save(*t.model, *t.opt, p);
  }
  auto files = checkpointer.list();
  REQUIRE(files.size() == 2);
  CHECK(fs::path(files[0]).filename() == "checkpoint-20.pt");
  CHECK(fs::path(files[1]).filename() == "checkpoint-15.pt");
  // Damage the newest: the loader falls back to the one before.
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);
  auto back = checkpointer.load_latest(*t.model, *t.opt);
  REQUIRE(back);
  CHECK(back->step == 15);
}

TEST_CASE("checkpoint: SIGKILL during a save leaves the previous checkpoint loadable") {
  ScratchDir dir("ckpt_kill");
  std::mt19937 rng(1234);
  std::int64_t last_seen = 0;
  for (int round = 0; round < 6; ++round) {
    ctrun::testing::ChildProcess writer({CHECKPOINT_WRITER_PATH, dir.path()},
                                        dir.path() + "/writer.log");
    // Wait (bounded) for the first save, then kill at a random moment of a later one.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (Checkpointer(dir.path(), 0).list().empty() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
    writer.signal(SIGKILL);
    REQUIRE(writer.wait(10s) == 128 + SIGKILL);

    auto model = std::make_shared<torch::nn::LinearImpl>(1024, 1024);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    auto back = Checkpointer(dir.path(), 0).load_latest(*model, opt);
    REQUIRE(back);
    INFO("round " << round << ": loaded step " << back->step);
    // Whole: every value is the step it was saved at.
    CHECK(torch::all(model->weight == static_cast<double>(back->step)).item<bool>());
    CHECK(torch::all(model->bias == static_cast<double>(back->step)).item<bool>());
    CHECK(back->step >= 1);
    last_seen = back->step;
    // Each round starts over from step 1, so clear the directory.
    ctrun::testing::remove_tree(dir.path());
    fs::create_directories(dir.path());
  }
  CHECK(last_seen >= 1);
}
