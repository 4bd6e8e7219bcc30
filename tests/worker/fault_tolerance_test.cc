// Per-step fault tolerance (FaultTolerance) with replicas as threads of this process, each with
// its own quorum connection and Gloo communicator, against a ctrund in the test process. A
// replica "dies" by dropping its FaultTolerance mid-step (its sockets close, as a killed
// process's would) and is replaced by a fresh one that must heal from a peer.
#include "ctrun/worker/fault_tolerance.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "catch.h"
#include "ctrun/worker/ddp.h"
#include "ctrun/worker/sampler.h"
#include "ctrun/worker/sharded.h"
#include "fake_env.h"
#include "loopback_daemon.h"

using namespace ctrun::worker;
using namespace std::chrono_literals;
using ctrun::testing::env_of;
using ctrun::testing::LoopbackDaemon;

namespace {

constexpr std::uint64_t kDataset = 96;
constexpr std::uint64_t kBatch = 4;  // per replica and step
constexpr std::uint64_t kEpochs = 2;

WorkerEnv replica_env(std::uint16_t port, int index, int replicas) {
  auto env = read_worker_env(env_of({{"RANK", std::to_string(index)},
                                     {"WORLD_SIZE", std::to_string(replicas)},
                                     {"TORCHELASTIC_RUN_ID", "ft-train"},
                                     {"CTRUN_STORE_ADDR", "127.0.0.1"},
                                     {"CTRUN_STORE_PORT", std::to_string(port)},
                                     {"CTRUN_FAULT_TOLERANCE", "step"},
                                     {"CTRUN_REPLICA_ID", "node/" + std::to_string(index)}}));
  REQUIRE(env.ok());
  return env.value();
}

FaultToleranceOptions fast_options(int replicas) {
  FaultToleranceOptions o;
  o.max_replicas = replicas;
  o.collective_timeout = 3s;
  o.heartbeat_timeout = 1s;
  o.join_timeout = 5s;
  o.quorum_timeout = 20s;
  return o;
}

// Every replica initialises differently (`init`): the quorum makes them equal before step 1.
std::shared_ptr<torch::nn::SequentialImpl> make_model(float init) {
  auto model = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
  torch::NoGradGuard no_grad;
  float k = init;
  for (auto& p : model->parameters()) {
    p.copy_(torch::sin(torch::arange(p.numel(), torch::kFloat) * k).view(p.sizes()) * 0.5);
    k += 0.37f;
  }
  return model;
}

// Sample i: x = sin(i * (1, 2, 3, 4) / 10), y = cos(i / 7).
std::pair<torch::Tensor, torch::Tensor> samples(const std::vector<std::uint64_t>& indices) {
  std::vector<float> ids(indices.begin(), indices.end());
  auto i = torch::tensor(ids).view({-1, 1});
  auto x = torch::sin(i * torch::arange(1, 5, torch::kFloat).view({1, 4}) / 10);
  auto y = torch::cos(i / 7);
  return {x, y};
}

// The whole quorum's samples of the step the sampler is at, shared among `size` replicas.
std::vector<std::uint64_t> step_samples(const StepSampler& sampler, int size) {
  std::vector<std::uint64_t> all;
  for (int r = 0; r < size; ++r) {
    auto share = sampler.step(r, size);
    all.insert(all.end(), share.begin(), share.end());
  }
  return all;
}

// Every parameter, flattened into one tensor of its own (torch::cat copies).
torch::Tensor flat_parameters(const torch::nn::Module& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model.parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

struct ReplicaRun {
  // The whole quorum's samples of every step this replica committed, with its epoch.
  std::vector<std::pair<std::uint64_t, std::vector<std::uint64_t>>> committed;
  torch::Tensor parameters;
  FaultTolerance::Stats stats;
  std::int64_t final_step = 0;
  std::string error;
  bool died = false;
};

// Trains kEpochs; `die_at(step)` true: the worker dies after that step's backward. Stage 0: a
// replica of its own, through DDP; stages 1-3: a worker of a shard group of two (HSDP), the
// model sharded over the group at that stage and replicated across groups. Its parameters,
// gathered whole, are its result; `committed`, when given, follows its committed step.
ReplicaRun train_replica(const WorkerEnv& env, FaultToleranceOptions options, float init,
                         const std::function<bool(std::int64_t)>& die_at, int stage = 0,
                         std::atomic<std::int64_t>* committed = nullptr) {
  ReplicaRun run;
  try {
    auto model = make_model(init);
    SamplerOptions sampler_options;
    sampler_options.dataset_size = kDataset;
    sampler_options.seed = 5;
    StepSampler sampler(sampler_options, kBatch);
    std::unique_ptr<torch::optim::Adam> optimizer;
    if (stage == 0) {
      optimizer = std::make_unique<torch::optim::Adam>(model->parameters(),
                                                       torch::optim::AdamOptions(0.01));
    } else {
      options.shard_group_size = 2;
    }
    auto ft = FaultTolerance::start(env, options, {model.get(), optimizer.get(), &sampler});
    if (!ft) throw std::runtime_error(ft.error().message);
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<ShardedDataParallel> sharded;
    if (stage == 0) {
      DdpOptions ddp_options;
      ddp_options.broadcast_parameters = false;
      ddp = std::make_unique<DistributedDataParallel>(model, ft.value()->group(), ddp_options);
    } else {
      ShardingOptions sharding;
      sharding.stage = stage;
      sharding.broadcast_parameters = false;
      sharding.gather_in_step = false;
      sharding.replicate_group = &ft.value()->replicate_group();
      sharded = std::make_unique<ShardedDataParallel>(model, ft.value()->shard_group(), sharding);
      optimizer = std::make_unique<torch::optim::Adam>(sharded->shard_parameters(),
                                                       torch::optim::AdamOptions(0.01));
      ft.value()->set_state({model.get(), optimizer.get(), &sampler, sharded.get()});
    }
    for (;;) {
      if (sampler.epoch_done(1)) {
        if (sampler.epoch() + 1 >= kEpochs) break;
        sampler.set_epoch(sampler.epoch() + 1);
      }
      const auto step = ft.value()->begin_step();
      if (step.finished) break;
      if (sampler.epoch_done(step.size)) {  // healed to a peer's place at an epoch's end
        (void)ft.value()->should_commit();
        continue;
      }
      const auto mine = sampler.step(step.rank, step.size);
      auto [x, y] = samples(mine);
      // The sum over this replica's share, over the whole step's count, times the quorum's size
      // (which the averaging divides out): the quorum's mean, however it is shared.
      const double scale =
          static_cast<double>(step.size) / static_cast<double>(sampler.step_size(step.size));
      auto forward = [&] { return (model->forward(x) - y).pow(2).sum() * scale; };
      auto loss = sharded ? sharded->forward(forward) : forward();
      loss.backward();
      if (die_at(step.step)) {
        run.died = true;
        ddp.reset();
        sharded.reset();
        ft.value().reset();  // its sockets close, as a killed process's would
        return run;
      }
      auto all = step_samples(sampler, step.size);
      const std::uint64_t epoch = sampler.epoch();
      if (ft.value()->should_commit()) {
        if (sharded) {
          sharded->step(*optimizer);
        } else {
          optimizer->step();
        }
        run.committed.emplace_back(epoch, std::move(all));
        if (committed != nullptr) *committed = ft.value()->committed_step();
      }
      optimizer->zero_grad();
    }
    run.stats = ft.value()->stats();
    run.final_step = ft.value()->committed_step();
    // Sharded: gathered over the shard group, a collective of the group's two workers.
    std::optional<ShardedDataParallel::FullParameters> whole;
    if (sharded) whole.emplace(*sharded);
    run.parameters = flat_parameters(*model);
  } catch (const std::exception& e) {
    run.error = e.what();
  }
  return run;
}

// Shard groups (HSDP): `groups` groups of two workers, worker `index` of group `group` as the
// agent names it ("g<group>/<local rank>").
WorkerEnv sharded_env(std::uint16_t port, int group, int index, int groups) {
  auto env = read_worker_env(
      env_of({{"RANK", std::to_string(2 * group + index)},
              {"WORLD_SIZE", std::to_string(2 * groups)},
              {"LOCAL_RANK", std::to_string(index)},
              {"LOCAL_WORLD_SIZE", "2"},
              {"TORCHELASTIC_RUN_ID", "ft-hsdp"},
              {"CTRUN_STORE_ADDR", "127.0.0.1"},
              {"CTRUN_STORE_PORT", std::to_string(port)},
              {"CTRUN_FAULT_TOLERANCE", "step"},
              {"CTRUN_REPLICA_ID", "g" + std::to_string(group) + "/" + std::to_string(index)}}));
  REQUIRE(env.ok());
  return env.value();
}

// The same training in one process (every step's samples at once, one optimizer): what the
// groups compute together, up to the order of float sums.
torch::Tensor train_alone(float init) {
  auto model = make_model(init);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  SamplerOptions sampler_options;
  sampler_options.dataset_size = kDataset;
  sampler_options.seed = 5;
  StepSampler sampler(sampler_options, 4 * kBatch);
  for (;;) {
    if (sampler.epoch_done(1)) {
      if (sampler.epoch() + 1 >= kEpochs) break;
      sampler.set_epoch(sampler.epoch() + 1);
    }
    auto [x, y] = samples(sampler.step(0, 1));
    auto loss = (model->forward(x) - y).pow(2).sum() / static_cast<double>(sampler.step_size(1));
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    sampler.commit(1);
  }
  return flat_parameters(*model);
}

// Each sample of each epoch exactly once, over the committed steps of a replica that saw them
// all.
void check_exactly_once(const ReplicaRun& run) {
  std::map<std::uint64_t, std::multiset<std::uint64_t>> by_epoch;
  for (const auto& [epoch, indices] : run.committed) {
    by_epoch[epoch].insert(indices.begin(), indices.end());
  }
  REQUIRE(by_epoch.size() == kEpochs);
  for (const auto& [epoch, seen] : by_epoch) {
    INFO("epoch " << epoch);
    CHECK(seen.size() == kDataset);
    CHECK(std::set<std::uint64_t>(seen.begin(), seen.end()).size() == kDataset);
  }
}

}  // namespace

TEST_CASE("fault tolerance: the timeouts are checked as one hierarchy, each contradiction named") {
  CHECK(check_timeouts(FaultToleranceOptions{}).empty());
  CHECK(check_timeouts(fast_options(3)).empty());
  auto o = fast_options(3);
  o.collective_timeout = 5s;
  CHECK(check_timeouts(o).rfind(
            "fault tolerance: the collective timeout (5000 ms) must be shorter than the join "
            "timeout (5000 ms)",
            0) == 0);
  o = fast_options(3);
  o.join_timeout = 20s;
  CHECK(check_timeouts(o).rfind("fault tolerance: the join timeout (20000 ms) must be shorter "
                                "than the quorum timeout (20000 ms)",
                                0) == 0);
  o = fast_options(3);
  o.heartbeat_timeout = 30s;
  CHECK(check_timeouts(o).find("the heartbeat timeout (30000 ms) must be shorter than the "
                               "quorum timeout") != std::string::npos);
  o = fast_options(3);
  o.heartbeat_timeout = 50ms;
  CHECK(check_timeouts(o).find("at least 100 ms") != std::string::npos);
  o = fast_options(3);
  o.quorum_timeout = 0ms;
  CHECK(check_timeouts(o) == "fault tolerance: the quorum timeout must be positive, got 0 ms");

  // start() says it too, before connecting anywhere.
  auto model = make_model(1);
  torch::optim::SGD sgd(model->parameters(), 0.1);
  o = fast_options(3);
  o.collective_timeout = 10s;
  auto refused = FaultTolerance::start(replica_env(1, 0, 3), o, {model.get(), &sgd, nullptr});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("collective timeout") != std::string::npos);
  auto no_model = FaultTolerance::start(replica_env(1, 0, 3), fast_options(3), {});
  REQUIRE_FALSE(no_model.ok());
  CHECK(no_model.error().message.find("needs the module and the optimizer") != std::string::npos);
}

TEST_CASE("fault tolerance: three replicas that start different end identical, each sample once") {
  LoopbackDaemon daemon;
  std::vector<ReplicaRun> runs(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      runs[i] = train_replica(replica_env(daemon.port(), i, 3), fast_options(3),
                              1.0f + static_cast<float>(i), [](std::int64_t) { return false; });
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& run : runs) {
    INFO(run.error);
    REQUIRE(run.error.empty());
    CHECK(run.stats.steps_lost == 0);
    CHECK(run.stats.rebuilds == 1);
    CHECK(run.final_step == static_cast<std::int64_t>(2 * kDataset / (3 * kBatch)));
  }
  // Before step 1 everyone took rank 0's state: the different initialisations are gone.
  CHECK(runs[0].stats.heals_sent == 2);
  CHECK(torch::equal(runs[0].parameters, runs[1].parameters));
  CHECK(torch::equal(runs[0].parameters, runs[2].parameters));
  check_exactly_once(runs[0]);
}

TEST_CASE("fault tolerance: a replica lost mid-step costs one step and its replacement heals") {
  LoopbackDaemon daemon;
  std::vector<ReplicaRun> runs(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      runs[i] = train_replica(replica_env(daemon.port(), i, 3), fast_options(3),
                              1.0f + static_cast<float>(i),
                              [i](std::int64_t step) { return i == 2 && step == 4; });
    });
  }
  threads[2].join();
  REQUIRE(runs[2].died);
  // The agent starts a replacement in the same slot; it initialises on its own.
  std::thread replacement([&] {
    runs[3] = train_replica(replica_env(daemon.port(), 2, 3), fast_options(3), 9.0f,
                            [](std::int64_t) { return false; });
  });
  threads[0].join();
  threads[1].join();
  replacement.join();
  for (int i : {0, 1, 3}) {
    INFO("replica run " << i << ": " << runs[i].error);
    REQUIRE(runs[i].error.empty());
  }
  // The survivors lost the step the replica died in, and no committed one.
  CHECK(runs[0].stats.steps_lost >= 1);
  CHECK(runs[0].final_step == runs[1].final_step);
  CHECK(runs[0].final_step == runs[3].final_step);
  CHECK(runs[3].stats.heals_received == 1);
  CHECK(runs[0].stats.heals_sent + runs[1].stats.heals_sent >= 3);  // 2 at the start, 1 after
  CHECK(torch::equal(runs[0].parameters, runs[1].parameters));
  CHECK(torch::equal(runs[0].parameters, runs[3].parameters));
  check_exactly_once(runs[0]);
  check_exactly_once(runs[1]);
}

TEST_CASE("fault tolerance: a replica left alone of three gets no quorum and stops") {
  LoopbackDaemon daemon;
  auto options = fast_options(3);
  options.collective_timeout = 500ms;
  options.heartbeat_timeout = 300ms;
  options.join_timeout = 1s;
  options.quorum_timeout = 2s;
  std::vector<ReplicaRun> runs(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      runs[i] =
          train_replica(replica_env(daemon.port(), i, 3), options, 1.0f + static_cast<float>(i),
                        [i](std::int64_t step) { return i > 0 && step == 3; });
    });
  }
  for (auto& t : threads) t.join();
  CHECK(runs[1].died);
  CHECK(runs[2].died);
  INFO(runs[0].error);
  // Its step 3 committed when its collectives all ended before the others died (or not, when
  // a dying peer's socket closed first); the next step finds one replica of the last quorum's
  // three: no majority, no training alone.
  CHECK((runs[0].error.find("no quorum for step 4") != std::string::npos ||
         runs[0].error.find("no quorum for step 3") != std::string::npos));
  CHECK(runs[0].error.find("minority side of a partition") != std::string::npos);
}

TEST_CASE("fault tolerance with shard groups: two groups of two train as one model, every stage") {
  const int stage = GENERATE(1, 2, 3);
  INFO("stage " << stage);
  LoopbackDaemon daemon;
  std::vector<ReplicaRun> runs(4);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      // Each group initialises differently: before step 1 both take the first group's state.
      runs[w] = train_replica(
          sharded_env(daemon.port(), w / 2, w % 2, 2), fast_options(4),
          1.0f + static_cast<float>(w / 2), [](std::int64_t) { return false; }, stage);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& run : runs) {
    INFO(run.error);
    REQUIRE(run.error.empty());
    CHECK(run.stats.steps_lost == 0);
    CHECK(run.final_step == static_cast<std::int64_t>(2 * kDataset / (4 * kBatch)));
  }
  CHECK(runs[2].stats.heals_received == 1);
  CHECK(runs[3].stats.heals_received == 1);
  for (int w = 1; w < 4; ++w) CHECK(torch::equal(runs[0].parameters, runs[w].parameters));
  CHECK(torch::allclose(runs[0].parameters, train_alone(1.0f), 1e-4, 1e-5));
  check_exactly_once(runs[0]);
}

TEST_CASE(
    "fault tolerance with shard groups: a lost worker's group waits, its replacement takes the "
    "shard") {
  const int stage = GENERATE(1, 3);
  INFO("stage " << stage);
  LoopbackDaemon daemon;
  std::vector<ReplicaRun> runs(5);
  std::vector<std::thread> threads;
  std::atomic<std::int64_t> first_committed{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      runs[w] = train_replica(
          sharded_env(daemon.port(), w / 2, w % 2, 2), fast_options(4),
          1.0f + static_cast<float>(w / 2), [w](std::int64_t step) { return w == 3 && step == 3; },
          stage, w == 0 ? &first_committed : nullptr);
    });
  }
  threads[3].join();
  REQUIRE(runs[3].died);
  // The first group trains alone meanwhile (steps 3 to 5 at least); g1/0 waits for its group.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (first_committed < 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(first_committed >= 5);
  std::thread replacement([&] {
    runs[4] = train_replica(
        sharded_env(daemon.port(), 1, 1, 2), fast_options(4), 9.0f,
        [](std::int64_t) { return false; }, stage);
  });
  for (int w = 0; w < 3; ++w) threads[w].join();
  replacement.join();
  for (int w : {0, 1, 2, 4}) {
    INFO("worker run " << w << ": " << runs[w].error);
    REQUIRE(runs[w].error.empty());
    CHECK(runs[w].final_step == runs[0].final_step);
  }
  CHECK(runs[0].stats.steps_lost >= 1);
  CHECK(runs[2].stats.quorums_sat_out >= 1);
  // g1/0 sat out and so asked as holding nothing: it healed too, with the replacement.
  CHECK(runs[2].stats.heals_received == 2);
  CHECK(runs[4].stats.heals_received == 1);
  // (Not one process's result: while the first group trained alone, steps were half the size.)
  for (int w : {1, 2, 4}) CHECK(torch::equal(runs[0].parameters, runs[w].parameters));
  check_exactly_once(runs[0]);
  check_exactly_once(runs[1]);
}
