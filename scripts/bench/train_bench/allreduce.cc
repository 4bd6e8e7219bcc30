// allreduce_bench: all-reduce bus bandwidth of libctrun_worker's process group (Gloo), 1 KB to
// 64 MB of float32, run by ctrun (or torchrun) like any worker. Rank 0 prints, per size:
//   allreduce <bytes> <iterations> <microseconds per call> <busbw GB/s>
// busbw is nccl-tests' definition: bytes / time * 2 (n - 1) / n. allreduce_ref.py is the same
// measurement with torch.distributed.all_reduce (gloo); the iteration counts match.
#include <torch/types.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "ctrun/worker/env.h"
#include "ctrun/worker/process_group.h"

int main() {
  auto env = ctrun::worker::read_worker_env(ctrun::worker::process_environment());
  if (!env) {
    std::cerr << "allreduce_bench: " << env.error().message << "\n";
    return 2;
  }
  auto group = ctrun::worker::init_process_group(env.value());
  const int n = group->size();
  for (std::int64_t bytes = 1024; bytes <= (64 << 20); bytes *= 4) {
    // The same count on every rank (and in allreduce_ref.py): about 256 MB per size.
    const std::int64_t iterations = std::clamp<std::int64_t>((256 << 20) / bytes, 5, 500);
    auto tensor = torch::ones({bytes / 4}, torch::kFloat);
    for (int i = 0; i < 3; ++i) group->all_reduce(tensor);
    group->barrier();
    const auto started = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iterations; ++i) group->all_reduce(tensor);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double per_call = seconds / static_cast<double>(iterations);
    const double busbw = static_cast<double>(bytes) / per_call * 2.0 * (n - 1) / n / 1e9;
    if (group->rank() == 0) {
      std::printf("allreduce %lld %lld %.1f %.4f\n", static_cast<long long>(bytes),
                  static_cast<long long>(iterations), per_call * 1e6, busbw);
      std::fflush(stdout);
    }
  }
  group->barrier();
  return 0;
}
