// The process group a fault-tolerant trainer's steps use (FaultTolerance::group()): one object
// for the whole run, in front of the communicator of the current quorum. Its collectives never
// throw: a failure is reported to the gate and loses the step, and once a step is lost its
// remaining collectives are skipped (they would only wait on the dead peer again).
#pragma once

#include <string>

#include "ctrun/worker/process_group.h"

namespace ctrun::worker {

// What the group asks of the fault-tolerance manager.
class StepGate {
 public:
  virtual ~StepGate() = default;
  // The communicator for this step's collectives; nullptr when the step is lost (a collective
  // failed, or the quorum changed under it): the collective is skipped. May wait for the
  // step's quorum answer.
  virtual ProcessGroup* step_group() = 0;
  // A collective of this step failed: the step is lost, and the communicator with it.
  virtual void collective_failed(const std::string& why) = 0;
};

class ManagedGroup : public ProcessGroup {
 public:
  ManagedGroup(StepGate& gate, Backend backend)
      : ProcessGroup(0, 1), gate_(gate), backend_(backend) {}

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
};

}  // namespace ctrun::worker
