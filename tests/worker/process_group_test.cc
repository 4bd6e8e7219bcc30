// The process group's bootstraps (the daemon's store, a TCPStore as under torchrun, alone) and
// its failure modes: a peer that never comes is a timeout error, not a hang.
#include "ctrun/worker/process_group.h"

#include <torch/cuda.h>
#include <torch/types.h>

#include <atomic>

#include "catch.h"
#include "etcd_server.h"
#include "gloo_ranks.h"
#include "loopback_daemon.h"
#include "process.h"
#include "rendezvous/etcd/etcd.h"

using namespace std::chrono_literals;
using ctrun::testing::free_port;
using ctrun::worker::CollectiveError;
using ctrun::worker::ProcessGroup;
using ctrun::worker::WorkerEnv;

namespace {

// Every rank of `envs` joins on its own thread; each sums rank + 1 and gathers its rank.
std::vector<std::pair<double, std::vector<long>>> sum_and_gather(std::vector<WorkerEnv> envs) {
  std::vector<std::pair<double, std::vector<long>>> out(envs.size());
  std::vector<std::exception_ptr> errors(envs.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < envs.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        ctrun::worker::ProcessGroupOptions options;
        options.timeout = 20s;
        auto group = ctrun::worker::init_process_group(envs[r], options);
        auto t = torch::full({3}, static_cast<double>(group->rank() + 1), torch::kDouble);
        group->all_reduce(t);
        auto gathered = group->all_gather(torch::full({1}, group->rank(), torch::kLong));
        std::vector<long> ranks;
        for (const auto& g : gathered) ranks.push_back(g.item<long>());
        group->barrier();
        out[r] = {t[2].item<double>(), ranks};
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

WorkerEnv env_for(int rank, int world) {
  WorkerEnv e;
  e.rank = e.local_rank = rank;
  e.world_size = e.local_world_size = world;
  e.launched = true;
  e.run_id = "pg_test";
  return e;
}

void check_sum_and_gather(const std::vector<std::pair<double, std::vector<long>>>& results) {
  const int world = static_cast<int>(results.size());
  std::vector<long> expected_ranks;
  for (int r = 0; r < world; ++r) expected_ranks.push_back(r);
  for (const auto& [sum, ranks] : results) {
    CHECK(sum == world * (world + 1) / 2);
    CHECK(ranks == expected_ranks);
  }
}

}  // namespace

TEST_CASE("process group: bootstraps through the rendezvous daemon's store (ctrun)") {
  at::set_num_threads(1);
  ctrun::testing::LoopbackDaemon daemon;
  std::vector<WorkerEnv> envs;
  for (int r = 0; r < 3; ++r) {
    envs.push_back(env_for(r, 3));
    envs.back().store = daemon.store_address("rdzv/0/0/");
  }
  check_sum_and_gather(sum_and_gather(envs));
  // A restart of the same round (restart count 1) does not trip over the first attempt's keys.
  for (auto& e : envs) e.restart_count = 1;
  check_sum_and_gather(sum_and_gather(envs));
}

TEST_CASE("process group: bootstraps through the job's keys in etcd (--rdzv_backend=etcd)") {
  CTRUN_SKIP_WITHOUT_ETCD();
  at::set_num_threads(1);
  ctrun::testing::ScratchDir dir("pg_etcd");
  ctrun::testing::EtcdCluster etcd(dir, 1);
  std::vector<WorkerEnv> envs;
  for (int r = 0; r < 3; ++r) {
    envs.push_back(env_for(r, 3));
    envs.back().store = ctrun::rendezvous::etcd_store_address(
        ctrun::rendezvous::parse_endpoint_list(etcd.endpoints()).value(), "rdzv/0/0/");
  }
  check_sum_and_gather(sum_and_gather(envs));
  for (auto& e : envs) e.restart_count = 1;
  check_sum_and_gather(sum_and_gather(envs));
}

TEST_CASE("process group: bootstraps through a TCPStore at MASTER_ADDR:MASTER_PORT (torchrun)") {
  at::set_num_threads(1);
  std::vector<WorkerEnv> envs;
  const std::uint16_t port = free_port();
  for (int r = 0; r < 2; ++r) {
    envs.push_back(env_for(r, 2));
    envs.back().master_addr = "127.0.0.1";
    envs.back().master_port = port;  // rank 0 serves it (TORCHELASTIC_USE_AGENT_STORE=False)
  }
  check_sum_and_gather(sum_and_gather(envs));
}

TEST_CASE("process group: alone, with no launcher") {
  auto results = sum_and_gather({WorkerEnv{}});
  check_sum_and_gather(results);
}

TEST_CASE("process group: reduce-scatter and all-gather into one buffer, at 2 and 3 Gloo ranks") {
  at::set_num_threads(1);
  for (int world : {2, 3}) {
    INFO("world " << world);
    const int64_t chunk = 5;
    auto results = ctrun::testing::run_gloo_ranks<std::vector<torch::Tensor>>(
        world, [&](int rank, ProcessGroup& group) {
          // Rank r contributes (r + 1) * [0, 1, 2, ...]: the sum is (1 + ... + world) * that.
          auto input = torch::arange(world * chunk, torch::kFloat) * (rank + 1);
          auto reduced = torch::empty({chunk});
          group.reduce_scatter_async(reduced, input)->wait();
          // In place: this rank's chunk of the output is the input.
          auto gathered = torch::full({world * chunk}, -1.0f);
          gathered.narrow(0, rank * chunk, chunk).fill_(rank);
          group.all_gather_into_async(gathered, gathered.narrow(0, rank * chunk, chunk))->wait();
          auto invalid = std::string("no error");
          try {
            group.reduce_scatter_async(torch::empty({chunk + 1}), input);
          } catch (const std::invalid_argument& e) {
            invalid = e.what();
          }
          return std::vector<torch::Tensor>{reduced, gathered,
                                            torch::tensor(static_cast<int64_t>(invalid.size()))};
        });
    const double ranks_sum = world * (world + 1) / 2.0;
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r);
      CHECK(torch::equal(results[r][0],
                         torch::arange(r * chunk, (r + 1) * chunk, torch::kFloat) * ranks_sum));
      CHECK(torch::equal(results[r][1],
                         torch::arange(world, torch::kFloat).repeat_interleave(chunk)));
      CHECK(results[r][2].item<int64_t>() > 20);  // the shape error was a message, not a hang
    }
  }
}

TEST_CASE("process group: a reduce-scatter waiting on a silent peer is a timeout error") {
  at::set_num_threads(1);
  std::atomic<bool> rank0_done{false};
  const auto started = std::chrono::steady_clock::now();
  auto errors = ctrun::testing::run_gloo_ranks<std::string>(
      2,
      [&](int rank, ProcessGroup& group) -> std::string {
        if (rank == 1) {
          while (!rank0_done && std::chrono::steady_clock::now() - started < 30s) {
            std::this_thread::sleep_for(10ms);
          }
          return "";
        }
        std::string error = "no error";
        try {
          group.reduce_scatter_async(torch::empty({2}), torch::ones({4}))->wait();
        } catch (const CollectiveError& e) {
          error = e.what();
        }
        rank0_done = true;
        return error;
      },
      1500ms);
  CHECK_THAT(errors[0], Catch::Matchers::StartsWith("gloo reduce_scatter failed:") &&
                            Catch::Matchers::ContainsSubstring("imed out"));
  CHECK(std::chrono::steady_clock::now() - started < 20s);
}

TEST_CASE("process group: a peer that never joins the collective is a timeout error") {
  at::set_num_threads(1);
  std::atomic<bool> rank0_done{false};
  const auto started = std::chrono::steady_clock::now();
  auto errors = ctrun::testing::run_gloo_ranks<std::string>(
      2,
      [&](int rank, ProcessGroup& group) -> std::string {
        if (rank == 1) {
          // Alive but silent, until rank 0 has given up.
          while (!rank0_done && std::chrono::steady_clock::now() - started < 30s) {
            std::this_thread::sleep_for(10ms);
          }
          return "";
        }
        std::string error = "no error";
        try {
          group.all_reduce(torch::ones({4}));
        } catch (const CollectiveError& e) {
          error = e.what();
        }
        rank0_done = true;
        return error;
      },
      1500ms);
  const auto elapsed = std::chrono::steady_clock::now() - started;
  CHECK_THAT(errors[0], Catch::Matchers::StartsWith("gloo all_reduce failed:") &&
                            Catch::Matchers::ContainsSubstring("imed out"));
  CHECK(elapsed < 20s);
}

TEST_CASE("process group: backend names and an NCCL group without a GPU are clear errors") {
  CHECK(ctrun::worker::parse_backend("gloo") == ctrun::worker::Backend::kGloo);
  CHECK(ctrun::worker::parse_backend("nccl") == ctrun::worker::Backend::kNccl);
  CHECK_THROWS_WITH(ctrun::worker::parse_backend("mpi"),
                    "backend: expected gloo or nccl, got 'mpi'");
  ctrun::worker::ProcessGroupOptions options;
  options.backend = ctrun::worker::Backend::kNccl;
  if (torch::cuda::is_available()) return;  // a GPU machine: the NCCL tests run there instead
  try {
    ctrun::worker::init_process_group(WorkerEnv{}, options);
    FAIL("an NCCL group formed without a GPU");
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    CHECK(what.rfind("nccl: ", 0) == 0);
    CHECK((what.find("no CUDA device") != std::string::npos ||
           what.find("no NCCL backend") != std::string::npos));
  }
}
