#include "worker_runtime/process_groups/gloo_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <utility>

#include "ctrun/worker/heartbeat.h"
#include "worker_runtime/base/error_text.h"

namespace ctrun::worker {
namespace {

// c10d reports failures (a peer's closed connection, a timeout) as exceptions from wait().
// `then` runs once, after a successful wait (what is left to do on the caller's thread).
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, const char* op,
           std::function<void()> then = nullptr)
      : work_(std::move(work)), op_(op), then_(std::move(then)) {}
  void wait() override {
    // The time blocked here is time this rank waits for its peers (and for what is left of the
    // transfer): the straggler verdict's measure (heartbeat.h).
    const auto began = std::chrono::steady_clock::now();
    try {
      work_->wait();
    } catch (const std::exception& e) {
      add_collective_wait(std::chrono::steady_clock::now() - began);
      throw CollectiveError(std::string("gloo ") + op_ + " failed: " + first_line(e.what()));
    }
    add_collective_wait(std::chrono::steady_clock::now() - began);
    if (then_) std::exchange(then_, nullptr)();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  const char* op_;
  std::function<void()> then_;
};

// c10d's Gloo (torch 1.13) has no bfloat16 (nor int16). Gathers and broadcasts only move bytes:
// they go as half, which Gloo copies without arithmetic. Sums go in float32, rounded back once
// at the end (no worse than summing in bfloat16, and the same on every rank).
bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }
at::Tensor as_bytes16(const at::Tensor& t) { return is_bf16(t) ? t.view(at::kHalf) : t; }

class GlooGroup : public ProcessGroup {
 public:
  GlooGroup(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, int rank, int size)
      : ProcessGroup(rank, size), pg_(std::move(pg)) {}

  Backend backend() const override { return Backend::kGloo; }

  std::unique_ptr<Work> all_reduce_async(at::Tensor tensor) override {
    if (is_bf16(tensor)) {
      std::vector<at::Tensor> wide{tensor.to(at::kFloat)};
      return std::make_unique<GlooWork>(pg_->allreduce(wide), "all_reduce",
                                        [tensor, sum = wide[0]]() mutable { tensor.copy_(sum); });
    }
    std::vector<at::Tensor> tensors{std::move(tensor)};
    return std::make_unique<GlooWork>(pg_->allreduce(tensors), "all_reduce");
  }

  // c10d's Gloo has no reduce-scatter before torch 2.x: an all-reduce, of which this rank keeps
  // its chunk. The result is the same; the traffic is an all-reduce's (twice a ring
  // reduce-scatter's). `input` ends up holding the whole sum.
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor output, at::Tensor input) override {
    check_chunks("reduce_scatter", input, output);
    const int64_t n = output.numel();
    if (is_bf16(input)) input = input.to(at::kFloat);
    at::Tensor mine = input.narrow(0, rank() * n, n);
    std::vector<at::Tensor> tensors{std::move(input)};
    return std::make_unique<GlooWork>(pg_->allreduce(tensors), "reduce_scatter",
                                      [output, mine]() mutable { output.copy_(mine); });
  }

  std::unique_ptr<Work> all_gather_into_async(at::Tensor output, at::Tensor input) override {
    check_chunks("all_gather", output, input);
    // Gloo gathers into its own buffer and then copies into these views of `output`, so
    // `input` may be one of them.
    std::vector<std::vector<at::Tensor>> outputs{as_bytes16(output).chunk(size())};
    std::vector<at::Tensor> inputs{as_bytes16(input)};
    return std::make_unique<GlooWork>(pg_->allgather(outputs, inputs), "all_gather");
  }

  void broadcast(at::Tensor tensor, int root) override {
    // Gloo has no bool type (masks are bool buffers): the same bytes, seen as uint8.
    if (tensor.scalar_type() == at::kBool) tensor = tensor.view(at::kByte);
    tensor = as_bytes16(tensor);
    std::vector<at::Tensor> tensors{std::move(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    GlooWork(pg_->broadcast(tensors, options), "broadcast").wait();
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) override {
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(tensor));
    std::vector<std::vector<at::Tensor>> wire{{}};
    for (const auto& out : outputs[0]) wire[0].push_back(as_bytes16(out));
    std::vector<at::Tensor> inputs{as_bytes16(tensor)};
    GlooWork(pg_->allgather(wire, inputs), "all_gather").wait();
    return outputs[0];
  }

  void barrier() override { GlooWork(pg_->barrier(), "barrier").wait(); }

  void send(const at::Tensor& tensor, int dst) override {
    std::vector<at::Tensor> tensors{tensor};
    GlooWork(pg_->send(tensors, dst, /*tag=*/0), "send").wait();
  }

  void recv(at::Tensor tensor, int src) override {
    std::vector<at::Tensor> tensors{std::move(tensor)};
    GlooWork(pg_->recv(tensors, src, /*tag=*/0), "recv").wait();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, const std::string& host,
                                              std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  try {
    if (ifname != nullptr && *ifname != '\0') {
      // torch's rule: a comma-separated list gives one device per interface.
      std::string list(ifname);
      for (std::size_t start = 0; start <= list.size();) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        options->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForInterface(list.substr(start, comma - start)));
        start = comma + 1;
      }
    } else if (!host.empty()) {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    } else {
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    return std::make_unique<GlooGroup>(std::move(pg), rank, size);
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError("gloo: joining a world of " + std::to_string(size) + " as rank " +
                          std::to_string(rank) + " failed: " + first_line(e.what()));
  }
}

}  // namespace ctrun::worker
