// DistributedDataParallel against the definition of data parallelism: N ranks on N slices of a
// global batch must end bit-identical to each other and equal (within float rounding) to one
// process training on the whole batch.
#include "ctrun/worker/ddp.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <mutex>

#include "catch.h"
#include "gloo_ranks.h"

using ctrun::testing::run_gloo_ranks;
using ctrun::worker::DdpOptions;
using ctrun::worker::DistributedDataParallel;
using ctrun::worker::ProcessGroup;

namespace {

constexpr int kBatch = 8;  // per rank, per micro-step

std::shared_ptr<torch::nn::SequentialImpl> make_model(std::uint64_t init_seed) {
  auto model = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(),
      torch::nn::Linear(32, 4));
  // A private generator: ranks are threads, and the global one is shared.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(init_seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.copy_(at::randn(p.sizes(), generator) * 0.3);
  return model;
}

// The global batch of step `step`: rows [r * rows, (r + 1) * rows) belong to rank r.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int rows) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return {at::randn({rows, 16}, generator), at::randn({rows, 4}, generator)};
}

torch::Tensor flat_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().reshape(-1).clone());
  return torch::cat(flat);
}

// One process, whole batches: what DDP must reproduce.
torch::Tensor train_reference(int world, int steps, int micro_steps) {
  auto model = make_model(100);  // rank 0's initialisation
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, world * kBatch * micro_steps);
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
  return flat_parameters(*model);
}

struct RankResult {
  torch::Tensor parameters;
  int starts_under_no_sync = 0;
};

// Rank r of a DDP run; each rank starts from a different initialisation (DDP must broadcast
// rank 0's). Micro-step m of rank r reads rows of the global batch that the reference also uses.
RankResult train_rank(int rank, ProcessGroup& group, int steps, int micro_steps,
                      DdpOptions options = {}) {
  auto model = make_model(100 + rank);
  int starts = 0;
  options.on_bucket_start = [&](std::size_t) { ++starts; };
  DistributedDataParallel ddp(model, group, options);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
  RankResult result;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, group.size() * kBatch * micro_steps);
    opt.zero_grad();
    for (int m = 0; m < micro_steps; ++m) {
      const int64_t row = (static_cast<int64_t>(m) * group.size() + rank) * kBatch;
      auto loss = torch::mse_loss(model->forward(x.slice(0, row, row + kBatch)),
                                  y.slice(0, row, row + kBatch)) /
                  micro_steps;
      if (m + 1 < micro_steps) {
        auto no_sync = ddp.no_sync();
        const int before = starts;
        loss.backward();
        result.starts_under_no_sync += starts - before;
      } else {
        loss.backward();
      }
    }
    opt.step();
  }
  result.parameters = flat_parameters(*model);
  return result;
}

void check_against_reference(const std::vector<RankResult>& ranks, const torch::Tensor& reference) {
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    INFO("rank " << r);
    CHECK(torch::equal(ranks[r].parameters, ranks[0].parameters));  // bit-identical
  }
  const double max_diff = (ranks[0].parameters - reference).abs().max().item<double>();
  INFO("max |ddp - single process| = " << max_diff);
  CHECK(max_diff < 1e-5);
  // And training moved the parameters (the check above is not trivially true).
  CHECK((reference - train_reference(1, 0, 1)).abs().max().item<double>() > 1e-2);
}

}  // namespace

TEST_CASE("ddp: 2 and 3 Gloo ranks match one process on the global batch, bit-identically") {
  at::set_num_threads(1);
  for (int world : {2, 3}) {
    INFO("world " << world);
    // Small buckets, so several all-reduces run per step.
    DdpOptions options;
    options.first_bucket_bytes = 600;
    options.bucket_bytes = 2000;
    auto ranks = run_gloo_ranks<RankResult>(world, [&](int rank, ProcessGroup& group) {
      return train_rank(rank, group, 6, 1, options);
    });
    check_against_reference(ranks, train_reference(world, 6, 1));
  }
}

TEST_CASE("ddp: gradient accumulation with no_sync equals the larger global batch") {
  at::set_num_threads(1);
  auto ranks = run_gloo_ranks<RankResult>(
      2, [&](int rank, ProcessGroup& group) { return train_rank(rank, group, 4, 3); });
  check_against_reference(ranks, train_reference(2, 4, 3));
  CHECK(ranks[0].starts_under_no_sync == 0);  // no communication in accumulation micro-steps
  CHECK(ranks[1].starts_under_no_sync == 0);
}

TEST_CASE("ddp: without overlap (one all-reduce after backward) the result is the same") {
  at::set_num_threads(1);
  DdpOptions options;
  options.overlap = false;
  auto ranks = run_gloo_ranks<RankResult>(
      2, [&](int rank, ProcessGroup& group) { return train_rank(rank, group, 3, 1, options); });
  check_against_reference(ranks, train_reference(2, 3, 1));
}

TEST_CASE("ddp: buckets follow reverse registration order and the configured sizes") {
  at::set_num_threads(1);
  struct Layout {
    std::vector<ctrun::worker::DdpBucket> buckets;
    std::size_t parameters = 0;
  };
  auto layouts = run_gloo_ranks<Layout>(1, [](int, ProcessGroup& group) {
    auto model = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
        torch::nn::Linear(64, 64));  // each: 16384-byte weight, 256-byte bias
    DdpOptions options;
    options.first_bucket_bytes = 1000;
    options.bucket_bytes = 20000;
    DistributedDataParallel ddp(model, group, options);
    return Layout{ddp.buckets(), model->parameters().size()};
  });
  const auto& buckets = layouts[0].buckets;
  // A bucket closes once it reaches its cap: the small first one after the last layer's bias
  // and weight, the next after two more layers, the last holds what is left.
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0].parameters == std::vector<std::size_t>{7, 6});
  CHECK(buckets[0].bytes == 256 + 16384);
  CHECK(buckets[1].parameters == std::vector<std::size_t>{5, 4, 3, 2});
  CHECK(buckets[1].bytes == 2 * 16640);
  CHECK(buckets[2].parameters == std::vector<std::size_t>{1, 0});
  std::size_t total = 0;
  for (const auto& b : buckets) total += b.bytes;
  CHECK(total == 4 * (16384 + 256));
}

TEST_CASE("ddp: all-reduces start during backward, in bucket order") {
  at::set_num_threads(1);
  using Events = std::vector<std::string>;
  auto events = run_gloo_ranks<Events>(2, [](int, ProcessGroup& group) {
    Events seen;
    std::mutex mutex;
    auto record = [&](std::string e) {
      std::lock_guard lock(mutex);
      seen.push_back(std::move(e));
    };
    auto model = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64),
        torch::nn::Linear(64, 8));
    auto layer = [&](std::size_t i) { return (*model)[i]->as<torch::nn::Linear>(); };
    DdpOptions options;
    options.first_bucket_bytes = 1000;
    options.bucket_bytes = 16000;
    options.on_bucket_start = [&](std::size_t b) { record("start " + std::to_string(b)); };
    DistributedDataParallel ddp(model, group, options);
    auto x = torch::randn({4, 64});
    // The gradient of the first layer's output is computed late in backward, after every later
    // layer's parameter gradients and before the first layer's own.
    auto first_out = layer(0)->forward(x);
    first_out.register_hook([&](torch::Tensor g) {
      record("first layer output gradient");
      return g;
    });
    auto rest = first_out;
    for (std::size_t i = 1; i < model->size(); ++i) rest = layer(i)->forward(torch::tanh(rest));
    rest.sum().backward();
    record("backward returned");
    return seen;
  });
  for (const auto& seen : events) {
    REQUIRE(seen.size() >= 4);
    auto pos = [&](const std::string& e) {
      return std::find(seen.begin(), seen.end(), e) - seen.begin();
    };
    const auto hook = pos("first layer output gradient");
    REQUIRE(hook < static_cast<long>(seen.size()));
    // Buckets of the later layers started before backward reached the first layer.
    CHECK(pos("start 0") < hook);
    CHECK(pos("start 1") < hook);
    CHECK(pos("backward returned") == static_cast<long>(seen.size()) - 1);
    // Starts are in index order.
    int expected = 0;
    for (const auto& e : seen) {
      if (e.rfind("start ", 0) == 0) CHECK(e == "start " + std::to_string(expected++));
    }
  }
}

namespace {

struct TwoHeads : torch::nn::Module {
  TwoHeads() {
    used = register_module("used", torch::nn::Linear(8, 2));
    unused = register_module("unused", torch::nn::Linear(8, 2));
  }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};

}  // namespace

TEST_CASE("ddp: a parameter without a gradient is an error unless find_unused_parameters") {
  at::set_num_threads(1);
  auto errors = run_gloo_ranks<std::string>(2, [](int, ProcessGroup& group) {
    auto model = std::make_shared<TwoHeads>();
    DistributedDataParallel ddp(model, group);
    try {
      model->used->forward(torch::randn({4, 8})).sum().backward();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Matchers::ContainsSubstring("'unused.weight', 'unused.bias'") &&
                      Catch::Matchers::ContainsSubstring("find_unused_parameters"));
  }

  auto grads = run_gloo_ranks<torch::Tensor>(2, [](int rank, ProcessGroup& group) {
    auto model = std::make_shared<TwoHeads>();
    DdpOptions options;
    options.find_unused_parameters = true;
    DistributedDataParallel ddp(model, group, options);
    for (int step = 0; step < 2; ++step) {
      // Rank 1 uses the second head, rank 0 does not: the average still reaches both.
      auto x = torch::ones({2, 8}) * (rank + 1);
      auto out = model->used->forward(x).sum();
      if (rank == 1) out = out + model->unused->forward(x).sum();
      model->zero_grad();
      out.backward();
    }
    return model->unused->weight.grad().clone();
  });
  REQUIRE(grads[0].defined());
  CHECK(torch::equal(grads[0], grads[1]));
  CHECK(torch::allclose(grads[0], torch::full({2, 8}, 2.0)));  // (0 + 4) / 2
}
