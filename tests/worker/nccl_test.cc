// The NCCL backend on a real GPU. NCCL refuses two ranks of one communicator on one device, so
// on a one-GPU machine the world here is one rank (every collective, through the daemon's
// store), plus a world of two whose second rank never comes. Each case warns and passes where
// there is no CUDA device or this build has no NCCL (the CPU CI): scripts/gpu-build.sh runs
// them on a GPU machine.
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <functional>

#include "catch.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/process_group.h"
#include "ctrun/worker/sharded.h"
#include "loopback_daemon.h"
#include "skip.h"
#include "worker_runtime/process_groups/ctrun_store.h"
#include "worker_runtime/process_groups/nccl_group.h"

using namespace std::chrono_literals;
using ctrun::worker::CollectiveError;

#define CTRUN_SKIP_WITHOUT_GPU()                                                      \
  do {                                                                                \
    if (!ctrun::worker::nccl_available() || !torch::cuda::is_available()) {           \
      CTRUN_SKIP("needs a CUDA device and a build with NCCL (scripts/gpu-build.sh)"); \
    }                                                                                 \
  } while (false)

namespace {

// A store for the NCCL id, as a worker of a job under ctrun gets it.
c10::intrusive_ptr<c10d::Store> connect(const ctrun::testing::LoopbackDaemon& daemon,
                                        const std::string& prefix) {
  return c10::make_intrusive<ctrun::worker::CtrunStore>(daemon.store_address("rdzv/0/0/"),
                                                        "nccl_test", prefix, 20s);
}

torch::TensorOptions on_gpu(torch::Dtype dtype) {
  return torch::TensorOptions().dtype(dtype).device(torch::kCUDA, 0);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("nccl: one rank on one GPU forms through the daemon's store and runs each collective") {
  CTRUN_SKIP_WITHOUT_GPU();
  ctrun::testing::LoopbackDaemon daemon(120s);
  auto store = connect(daemon, "ctrun/pg/0/");
  auto group = ctrun::worker::make_nccl_group(store, 0, 1, 0, 20s);
  CHECK(group->backend() == ctrun::worker::Backend::kNccl);
  CHECK(group->size() == 1);
  // Rank 0 published the communicator's id there.
  CHECK(store->check({"nccl/unique_id"}));

  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble, torch::kLong}) {
    auto t = torch::arange(1000, on_gpu(dtype));
    const auto before = t.clone();
    group->all_reduce(t);  // a sum over one rank
    CHECK(torch::equal(t, before));
  }
  auto mask = torch::ones({7}, on_gpu(torch::kBool));
  group->all_reduce(mask);
  CHECK(mask.all().item<bool>());

  auto b = torch::full({3, 5}, 2.5, on_gpu(torch::kFloat));
  group->broadcast(b, 0);
  CHECK(torch::equal(b, torch::full({3, 5}, 2.5, on_gpu(torch::kFloat))));

  const auto gathered = group->all_gather(torch::full({4}, 3, on_gpu(torch::kLong)));
  REQUIRE(gathered.size() == 1);
  CHECK(gathered[0].device() == torch::Device(torch::kCUDA, 0));
  CHECK(torch::equal(gathered[0], torch::full({4}, 3, on_gpu(torch::kLong))));

  group->barrier();
  // Many collectives in flight at once, as DDP's buckets are, waited in order.
  std::vector<torch::Tensor> buckets;
  std::vector<std::unique_ptr<ctrun::worker::Work>> works;
  for (int i = 0; i < 16; ++i) {
    buckets.push_back(torch::full({1 << 18}, i, on_gpu(torch::kFloat)));
    works.push_back(group->all_reduce_async(buckets.back()));
  }
  for (auto& w : works) w->wait();
  for (int i = 0; i < 16; ++i) CHECK(buckets[i].eq(i).all().item<bool>());
}

TEST_CASE("nccl: tensors off the group's device, bad devices and missing ranks are clear errors") {
  CTRUN_SKIP_WITHOUT_GPU();
  ctrun::testing::LoopbackDaemon daemon(120s);
  auto group = ctrun::worker::make_nccl_group(connect(daemon, "a/"), 0, 1, 0, 20s);
  CHECK(error_of([&] {
          group->all_reduce(torch::ones({4}));
        }).find("nccl: tensors must be contiguous and on cuda:0, got one on cpu") == 0);
  CHECK(error_of([&] {
          group->broadcast(torch::ones({4, 4}, on_gpu(torch::kFloat)).t(), 0);
        }).find("nccl: tensors must be contiguous") == 0);

  const int devices = static_cast<int>(torch::cuda::device_count());
  CHECK(error_of([&] {
          ctrun::worker::make_nccl_group(connect(daemon, "b/"), 0, 1, devices, 20s);
        }).find("has no CUDA device") != std::string::npos);

  // A world of two whose rank 1 never comes: the (non-blocking) init gives up at the deadline.
  const auto started = std::chrono::steady_clock::now();
  const std::string timed_out =
      error_of([&] { ctrun::worker::make_nccl_group(connect(daemon, "c/"), 0, 2, 0, 3s); });
  const auto took = std::chrono::steady_clock::now() - started;
  INFO(timed_out);
  CHECK(timed_out.find("nccl init (ncclCommInitRank) timed out after 3000 ms") == 0);
  CHECK(took >= 3s);
  CHECK(took < 30s);

  // The GPU is still usable afterwards: a fresh group works.
  auto again = ctrun::worker::make_nccl_group(connect(daemon, "d/"), 0, 1, 0, 20s);
  auto t = torch::ones({8}, on_gpu(torch::kFloat));
  again->all_reduce(t);
  CHECK(t.sum().item<float>() == 8.0f);
}

TEST_CASE("nccl: DDP on one GPU trains exactly like the model alone") {
  CTRUN_SKIP_WITHOUT_GPU();
  ctrun::testing::LoopbackDaemon daemon(120s);
  auto group = ctrun::worker::make_nccl_group(connect(daemon, "ddp/"), 0, 1, 0, 20s);
  torch::manual_seed(3);
  auto make = [] {
    auto net = torch::nn::Sequential(torch::nn::Linear(64, 512), torch::nn::ReLU(),
                                     torch::nn::Linear(512, 512), torch::nn::ReLU(),
                                     torch::nn::Linear(512, 10));
    net->to(torch::Device(torch::kCUDA, 0));
    return net;
  };
  auto alone = make();
  auto wrapped = make();
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < alone->parameters().size(); ++i) {
      wrapped->parameters()[i].copy_(alone->parameters()[i]);
    }
  }
  ctrun::worker::DdpOptions options;
  options.first_bucket_bytes = 16 << 10;  // several buckets, started from the backward pass
  options.bucket_bytes = 64 << 10;
  ctrun::worker::DistributedDataParallel ddp(wrapped.ptr(), *group, options);
  CHECK(ddp.buckets().size() > 2);
  torch::optim::SGD opt_alone(alone->parameters(), 0.1);
  torch::optim::SGD opt_wrapped(wrapped->parameters(), 0.1);
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({32, 64}, on_gpu(torch::kFloat));
    auto y = torch::randint(0, 10, {32}, on_gpu(torch::kLong));
    for (auto* pair : {&alone, &wrapped}) {
      auto loss = torch::nn::functional::cross_entropy((*pair)->forward(x), y);
      loss.backward();
    }
    for (std::size_t i = 0; i < alone->parameters().size(); ++i) {
      CHECK(torch::equal(alone->parameters()[i].grad(), wrapped->parameters()[i].grad()));
    }
    opt_alone.step();
    opt_wrapped.step();
    opt_alone.zero_grad();
    opt_wrapped.zero_grad();
  }
  for (std::size_t i = 0; i < alone->parameters().size(); ++i) {
    CHECK(torch::equal(alone->parameters()[i], wrapped->parameters()[i]));
  }
}

TEST_CASE("nccl: reduce-scatter, all-gather into one buffer, and each ZeRO stage on one GPU") {
  CTRUN_SKIP_WITHOUT_GPU();
  ctrun::testing::LoopbackDaemon daemon(120s);
  auto group = ctrun::worker::make_nccl_group(connect(daemon, "zero/"), 0, 1, 0, 20s);
  auto input = torch::arange(64, on_gpu(torch::kFloat));
  auto output = torch::empty({64}, on_gpu(torch::kFloat));
  group->reduce_scatter_async(output, input.clone())->wait();
  CHECK(torch::equal(output, input));
  auto gathered = torch::zeros({64}, on_gpu(torch::kBFloat16));
  group->all_gather_into_async(gathered, input.to(torch::kBFloat16))->wait();
  CHECK(torch::equal(gathered, input.to(torch::kBFloat16)));
  CHECK_THROWS_AS(group->all_gather_into_async(gathered, input.to(torch::kBFloat16).cpu()),
                  std::invalid_argument);

  torch::manual_seed(5);
  auto make = [] {
    auto net = torch::nn::Sequential(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                                     torch::nn::Linear(256, 10));
    net->to(torch::Device(torch::kCUDA, 0));
    return net;
  };
  auto alone = make();
  torch::optim::Adam opt_alone(alone->parameters(), torch::optim::AdamOptions(1e-3));
  std::vector<torch::nn::Sequential> wrapped;
  std::vector<std::unique_ptr<ctrun::worker::ShardedDataParallel>> sharded;
  std::vector<std::unique_ptr<torch::optim::Adam>> optimizers;
  for (int stage : {1, 2, 3}) {
    wrapped.push_back(make());
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < alone->parameters().size(); ++i) {
      wrapped.back()->parameters()[i].copy_(alone->parameters()[i]);
    }
    ctrun::worker::ShardingOptions options;
    options.stage = stage;
    options.units = {wrapped.back()[0]};  // the first Linear; the rest is the root
    sharded.push_back(std::make_unique<ctrun::worker::ShardedDataParallel>(wrapped.back().ptr(),
                                                                           *group, options));
    optimizers.push_back(std::make_unique<torch::optim::Adam>(sharded.back()->shard_parameters(),
                                                              torch::optim::AdamOptions(1e-3)));
  }
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({32, 64}, on_gpu(torch::kFloat));
    auto y = torch::randint(0, 10, {32}, on_gpu(torch::kLong));
    torch::nn::functional::cross_entropy(alone->forward(x), y).backward();
    opt_alone.step();
    opt_alone.zero_grad();
    for (std::size_t s = 0; s < sharded.size(); ++s) {
      auto& net = wrapped[s];
      auto& zero = *sharded[s];
      auto loss = zero.forward([&] {
        auto h =
            zero.forward_unit(*net[0], [&] { return net[0]->as<torch::nn::Linear>()->forward(x); });
        return torch::nn::functional::cross_entropy(
            net[2]->as<torch::nn::Linear>()->forward(torch::relu(h)), y);
      });
      loss.backward();
      zero.step(*optimizers[s]);
    }
  }
  for (std::size_t s = 0; s < sharded.size(); ++s) {
    INFO("stage " << s + 1);
    auto whole = sharded[s]->full_parameters();
    for (std::size_t i = 0; i < alone->parameters().size(); ++i) {
      CHECK(torch::allclose(alone->parameters()[i], wrapped[s]->parameters()[i], 1e-5, 1e-6));
    }
  }
}
