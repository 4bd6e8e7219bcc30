#include "worker_runtime/fault_tolerance/managed_group.h"

#include "worker_runtime/base/error_text.h"

namespace ctrun::worker {
namespace {

// Waits through the gate: a failed wait loses the step instead of throwing.
class GatedWork : public Work {
 public:
  GatedWork(std::unique_ptr<Work> inner, StepGate& gate, Span span)
      : inner_(std::move(inner)), gate_(gate), span_(span) {}
  void wait() override {
    if (!inner_) return;
    try {
      inner_->wait();
    } catch (const std::exception& e) {
      gate_.collective_failed(span_, first_line(e.what()));
    }
    inner_.reset();
  }

 private:
  std::unique_ptr<Work> inner_;
  StepGate& gate_;
  Span span_;
};

}  // namespace

template <typename Op>
bool ManagedGroup::run(const char* name, Op&& op) {
  ProcessGroup* group = gate_.step_group(span_);
  if (group == nullptr) return false;
  try {
    op(*group);
    return true;
  } catch (const std::exception& e) {
    gate_.collective_failed(span_, std::string(name) + ": " + first_line(e.what()));
    return false;
  }
}

std::unique_ptr<Work> ManagedGroup::all_reduce_async(at::Tensor tensor) {
  std::unique_ptr<Work> inner;
  run("all_reduce", [&](ProcessGroup& g) { inner = g.all_reduce_async(std::move(tensor)); });
  return std::make_unique<GatedWork>(std::move(inner), gate_, span_);
}

std::unique_ptr<Work> ManagedGroup::reduce_scatter_async(at::Tensor output, at::Tensor input) {
  std::unique_ptr<Work> inner;
  run("reduce_scatter", [&](ProcessGroup& g) {
    inner = g.reduce_scatter_async(std::move(output), std::move(input));
  });
  return std::make_unique<GatedWork>(std::move(inner), gate_, span_);
}

std::unique_ptr<Work> ManagedGroup::all_gather_into_async(at::Tensor output, at::Tensor input) {
  std::unique_ptr<Work> inner;
  run("all_gather", [&](ProcessGroup& g) {
    inner = g.all_gather_into_async(std::move(output), std::move(input));
  });
  return std::make_unique<GatedWork>(std::move(inner), gate_, span_);
}

void ManagedGroup::broadcast(at::Tensor tensor, int root) {
  run("broadcast", [&](ProcessGroup& g) { g.broadcast(std::move(tensor), root); });
}

std::vector<at::Tensor> ManagedGroup::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> out;
  if (run("all_gather", [&](ProcessGroup& g) { out = g.all_gather(tensor); })) return out;
  return std::vector<at::Tensor>(static_cast<std::size_t>(size()), tensor.clone());
}

void ManagedGroup::barrier() {
  run("barrier", [](ProcessGroup& g) { g.barrier(); });
}

void ManagedGroup::send(const at::Tensor& tensor, int dst) {
  run("send", [&](ProcessGroup& g) { g.send(tensor, dst); });
}

void ManagedGroup::recv(at::Tensor tensor, int src) {
  run("recv", [&](ProcessGroup& g) { g.recv(std::move(tensor), src); });
}

}  // namespace ctrun::worker
