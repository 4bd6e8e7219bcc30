// ShardedDataParallel against the definition of data parallelism: each ZeRO stage, on N ranks
// on N slices of a global batch, must train to the parameters one process reaches on the whole
// batch (within float rounding: the reductions sum in another order), with gradient
// accumulation and clipping, while each rank holds only its share of the state.
#include "ctrun/worker/sharded.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>

#include "catch.h"

#include "gloo_ranks.h"
#include "sharded_net.h"

using ctrun::testing::run_gloo_ranks;
using ctrun::worker::ProcessGroup;
using ctrun::worker::ShardedDataParallel;
using ctrun::worker::ShardingOptions;
using namespace ctrun::testing::sharded_net;

namespace {

constexpr int kBatch = 8;  // per rank, per micro-step
constexpr double kClip = 0.5;

// One process, whole batches, torch's own Adam and clip_grad_norm_: what sharding must reach.
torch::Tensor train_reference(int world, int steps, int micro_steps) {
  auto model = make_model(100);  // rank 0's initialisation
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, world * kBatch * micro_steps);
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
    opt.step();
  }
  return flat_parameters(*model);
}

struct RankResult {
  torch::Tensor parameters;   // whole, after training
  std::vector<double> norms;  // before clipping, each step
  int64_t shard_elements = 0;
  int64_t whole_grad_elements = 0;               // in the parameters' .grad after the last backward
  int64_t parameter_elements_between_steps = 0;  // what the module holds outside a step
  int units = 0;
  torch::Dtype master_type = torch::kFloat;     // of the shards the optimizer steps
  torch::Dtype parameter_type = torch::kFloat;  // of the module's parameters
};

RankResult train_rank(int rank, ProcessGroup& group, int stage, int steps, int micro_steps,
                      ShardingOptions options = {}) {
  auto model = make_model(100 + rank);  // differs per rank: the broadcast must fix it
  options.stage = stage;
  options.units = {model->block0.ptr(), model->block1.ptr()};
  options.unit_bytes = 4000;  // several units at stages 1-2 too
  ShardedDataParallel sharded(model.ptr(), group, options);
  model->run_unit = sharded.unit_forward();
  torch::optim::Adam opt(sharded.shard_parameters(), torch::optim::AdamOptions(0.01));
  RankResult result;
  result.units = static_cast<int>(sharded.unit_count());
  result.master_type = sharded.shard_parameters().front().scalar_type();
  for (const auto& shard : sharded.shard_parameters()) result.shard_elements += shard.numel();
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = global_batch(step, group.size() * kBatch * micro_steps);
    for (int m = 0; m < micro_steps; ++m) {
      const int64_t row = (static_cast<int64_t>(m) * group.size() + rank) * kBatch;
      auto loss = sharded.forward([&] {
        return torch::mse_loss(model->forward(x.slice(0, row, row + kBatch)),
                               y.slice(0, row, row + kBatch));
      }) / micro_steps;
      if (m + 1 < micro_steps) {
        auto no_sync = sharded.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    result.whole_grad_elements = 0;
    for (const auto& p : model->parameters()) {
      if (p.grad().defined()) result.whole_grad_elements += p.grad().numel();
    }
    result.norms.push_back(sharded.clip_grad_norm(kClip));
    sharded.step(opt);
  }
  for (const auto& p : model->parameters()) result.parameter_elements_between_steps += p.numel();
  {
    auto whole = sharded.full_parameters();
    result.parameters = flat_parameters(*model);
    result.parameter_type = model->parameters().front().scalar_type();
  }
  return result;
}

void check_against_reference(const std::vector<RankResult>& ranks, const torch::Tensor& reference) {
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    INFO("rank " << r);
    CHECK(torch::equal(ranks[r].parameters, ranks[0].parameters));  // bit-identical
    CHECK(ranks[r].norms == ranks[0].norms);
  }
  const double max_diff = (ranks[0].parameters - reference).abs().max().item<double>();
  INFO("max |sharded - single process| = " << max_diff);
  CHECK(max_diff < 1e-5);
  // Training moved the parameters, and clipping was in play (the checks above are not trivial).
  CHECK((reference - flat_parameters(*make_model(100))).abs().max().item<double>() > 1e-2);
  CHECK(ranks[0].norms.front() > kClip);
}

}  // namespace

TEST_CASE("sharded: stages 1, 2 and 3 at 2 and 3 Gloo ranks train to one process's parameters") {
  at::set_num_threads(1);
  for (int world : {2, 3}) {
    const auto reference = train_reference(world, 5, 1);
    for (int stage : {1, 2, 3}) {
      INFO("world " << world << ", stage " << stage);
      auto ranks = run_gloo_ranks<RankResult>(world, [&](int rank, ProcessGroup& group) {
        return train_rank(rank, group, stage, 5, 1);
      });
      check_against_reference(ranks, reference);
    }
  }
}

TEST_CASE("sharded: gradient accumulation under no_sync equals the larger global batch") {
  at::set_num_threads(1);
  const auto reference = train_reference(2, 4, 3);
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    auto ranks = run_gloo_ranks<RankResult>(
        2, [&](int rank, ProcessGroup& group) { return train_rank(rank, group, stage, 4, 3); });
    check_against_reference(ranks, reference);
  }
}

TEST_CASE("sharded: stage 3 without prefetch gives the same parameters") {
  at::set_num_threads(1);
  ShardingOptions options;
  options.prefetch = false;
  auto ranks = run_gloo_ranks<RankResult>(
      3, [&](int rank, ProcessGroup& group) { return train_rank(rank, group, 3, 4, 1, options); });
  check_against_reference(ranks, train_reference(3, 4, 1));
}

TEST_CASE("sharded: each rank holds its share: shards of 1/N, and per stage what stays whole") {
  at::set_num_threads(1);
  const int64_t total = flat_parameters(*make_model(0)).numel();
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    auto ranks = run_gloo_ranks<RankResult>(
        3, [&](int rank, ProcessGroup& group) { return train_rank(rank, group, stage, 1, 1); });
    for (const auto& rank : ranks) {
      // Each unit's shard is a third of it, rounded up: at most one element per unit more.
      CHECK(rank.shard_elements * 3 >= total);
      CHECK(rank.shard_elements * 3 <= total + 3 * rank.units);
      // Stage 1 keeps whole (averaged) gradients; stages 2-3 only their shards.
      CHECK(rank.whole_grad_elements == (stage == 1 ? total : 0));
      // Stage 3's module holds no parameter values between steps; the others, all of them.
      CHECK(rank.parameter_elements_between_steps == (stage == 3 ? 0 : total));
    }
    if (stage == 3) CHECK(ranks[0].units == 3);  // two blocks and the root
  }
}

TEST_CASE("sharded: bf16 parameters and collectives with fp32 master shards, at each stage") {
  at::set_num_threads(1);
  const auto reference = train_reference(2, 5, 1);
  torch::Tensor first_stage;
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    ShardingOptions options;
    options.param_dtype = torch::kBFloat16;
    auto ranks = run_gloo_ranks<RankResult>(2, [&](int rank, ProcessGroup& group) {
      return train_rank(rank, group, stage, 5, 1, options);
    });
    CHECK(torch::equal(ranks[0].parameters, ranks[1].parameters));
    CHECK(ranks[0].master_type == torch::kFloat);
    CHECK(ranks[0].parameter_type == torch::kBFloat16);
    // bf16 keeps 8 bits of mantissa: the same training as in fp32, not the same numbers. The
    // update (final - initial) against fp32's, relative to its size:
    const auto initial = flat_parameters(*make_model(100));
    const auto update = ranks[0].parameters.to(torch::kFloat) - initial;
    const double relative =
        ((update - (reference - initial)).norm() / (reference - initial).norm()).item<double>();
    INFO("|bf16 update - fp32 update| / |fp32 update| = " << relative);
    // (About half of it is the rounding of the final values to bf16.)
    CHECK(relative < 0.15);
    CHECK(relative > 0);
    // Every stage sums the same bf16 gradients in fp32 and steps the same fp32 masters.
    if (stage == 1) first_stage = ranks[0].parameters;
    CHECK(torch::equal(ranks[0].parameters, first_stage));
  }
}

TEST_CASE("sharded: bad options and a unit run outside are clear errors") {
  at::set_num_threads(1);
  auto errors = run_gloo_ranks<std::vector<std::string>>(1, [](int, ProcessGroup& group) {
    std::vector<std::string> seen;
    auto expect_error = [&](const std::function<void()>& f) {
      try {
        f();
        seen.push_back("no error");
      } catch (const std::invalid_argument& e) {
        seen.push_back(e.what());
      }
    };
    auto model = make_model(0);
    expect_error([&] {
      ShardingOptions options;
      options.stage = 4;
      ShardedDataParallel sharded(model.ptr(), group, options);
    });
    expect_error([&] {
      ShardingOptions options;
      options.units = {model->block0.ptr(), model->block0.ptr()};
      ShardedDataParallel sharded(model.ptr(), group, options);
    });
    expect_error([&] {
      ShardingOptions options;
      options.units = {Block().ptr()};
      ShardedDataParallel sharded(model.ptr(), group, options);
    });
    expect_error([&] {
      ShardingOptions options;
      options.units = {model->block0.ptr()};
      ShardedDataParallel sharded(model.ptr(), group, options);
      sharded.forward_unit(*model->block1, [] { return torch::zeros({1}); });
    });
    return seen;
  });
  const auto& seen = errors[0];
  REQUIRE(seen.size() == 4);
  CHECK(seen[0] == "ShardingOptions::stage: expected 1, 2 or 3, got 4");
  CHECK_THAT(seen[1], Catch::Matchers::ContainsSubstring("is in two units"));
  CHECK_THAT(seen[2],
             Catch::Matchers::ContainsSubstring("has a parameter that is not the model's"));
  CHECK_THAT(seen[3], Catch::Matchers::ContainsSubstring("is not one of ShardingOptions::units"));
}
