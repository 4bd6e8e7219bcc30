// Test helper: several ranks of one Gloo process group as threads of this process, meeting
// through an in-memory store. Catch2's assertions are not thread-safe, so rank bodies return
// what they saw and the test checks it afterwards.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "worker_runtime/process_groups/gloo_group.h"

namespace ctrun::testing {

template <typename Result>
std::vector<Result> run_gloo_ranks(int world,
                                   const std::function<Result(int, worker::ProcessGroup&)>& body,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Result> results(world);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = worker::make_gloo_group(store, r, world, "127.0.0.1", timeout);
        results[r] = body(r, *group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return results;
}

}  // namespace ctrun::testing
