// The process group a fault-tolerant trainer's steps use (FaultTolerance::group()): one object
// for the whole run, in front of the communicator of the current quorum. Its collectives never
// throw: a failure is reported to the gate and loses the step, and once a step is lost its
// remaining collectives are skipped (they would only wait on the dead peer again).
#pragma once

#include <string>

#include "ctrun/worker/process_group.h"

namespace ctrun::worker {

// Which of a step's communicators: all its training workers, or (shard groups) this worker's
// group, or the workers holding its shard in the other groups.
enum class Span { kWorld = 0, kShard = 1, kReplicas = 2 };
constexpr int kSpans = 3;

// What the group asks of the fault-tolerance manager.
class StepGate {
 public:
  virtual ~StepGate() = default;
  // The communicator for this step's collectives over `span`; nullptr when the step is lost
  // for it (a collective over it failed, or the quorum changed under the step): the collective
  // is skipped. Collectives over the other spans go on, so that their peers are not left
  // waiting. May wait for the step's quorum answer.
  virtual ProcessGroup* step_group(Span span) = 0;
  // A collective of this step over `span` failed: the step is lost, and the communicator with
  // it.
  virtual void collective_failed(Span span, const std::string& why) = 0;
};

class ManagedGroup : public ProcessGroup {
 public:
  ManagedGroup(StepGate& gate, Backend backend, Span span = Span::kWorld)
      : ProcessGroup(0, 1), gate_(gate), backend_(backend), span_(span) {}

  // The quorum changed: this replica's rank and the quorum's size.
  void reset(int rank, int size) { set_rank_and_size(rank, size); }

  Backend backend() const override { return backend_; }
  std::unique_ptr<Work> all_reduce_async(at::Tensor tensor) override;
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor output, at::Tensor input) override;
  std::unique_ptr<Work> all_gather_into_async(at::Tensor output, at::Tensor input) override;
  void broadcast(at::Tensor tensor, int root) override;
  // A skipped all_gather returns this rank's tensor in every slot.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) override;
  void barrier() override;
  void send(const at::Tensor& tensor, int dst) override;
  void recv(at::Tensor tensor, int src) override;

 private:
  // Runs `op` on the step's communicator unless the step is lost; a failure is the gate's.
  template <typename Op>
  bool run(const char* name, Op&& op);

  StepGate& gate_;
  Backend backend_;
  Span span_;
};

}  // namespace ctrun::worker
