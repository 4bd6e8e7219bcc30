// DistributedSampler: which samples of a dataset each rank reads in an epoch, as torch's
// DistributedSampler does it (one permutation per epoch from seed + epoch, rank r takes every
// world_size-th sample starting at r, padded by wrapping around or truncated with drop_last),
// plus what torch's lacks: resuming mid-epoch, also with a different world size.
//
// Resuming works because of the strided assignment: after each rank has read k samples, the
// ranks together have read exactly the first k * world_size samples of the epoch's order. That
// count (`consumed`) is what a checkpoint stores; a new world of any size re-partitions the rest.
#pragma once

#include <cstdint>
#include <vector>

namespace ctrun::worker {

struct SamplerOptions {
  std::uint64_t dataset_size = 0;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;  // drop the tail that does not divide evenly instead of padding
};

class DistributedSampler {
 public:
  // Throws std::invalid_argument for an empty dataset or a rank outside [0, world_size).
  DistributedSampler(SamplerOptions options, int rank, int world_size);

  // Starts epoch `epoch` from its beginning (torch's set_epoch).
  void set_epoch(std::uint64_t epoch);
  // Starts the current epoch after the first `consumed` samples of its order, which the ranks
  // of this or an earlier world have already read.
  void set_consumed(std::uint64_t consumed);

  // This rank's samples for the rest of the epoch, in reading order.
  std::vector<std::uint64_t> indices() const;
  // How many that is (the same on every rank).
  std::uint64_t num_samples() const;

  // The whole epoch's order over all ranks, unpadded: a permutation of [0, dataset_size).
  std::vector<std::uint64_t> epoch_order() const;

  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t consumed() const { return consumed_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  SamplerOptions options_;
  int rank_;
  int world_size_;
  std::uint64_t epoch_ = 0;
  std::uint64_t consumed_ = 0;
};

// The sampler of per-step fault tolerance (ctrun --fault_tolerance=step): exact, not lossy.
// Each step trains a contiguous stretch of the epoch's order (DistributedSampler's), starting
// where the last committed step ended; the quorum's members split it strided by their rank. A
// step that does not commit is trained again from the same place by whichever replicas form
// the next quorum, with shares recomputed for its size. So every sample of an epoch is trained
// on exactly once, whatever the membership does. The epoch's last step is short (no padding);
// with drop_last, a last stretch smaller than a whole step is skipped instead.
class StepSampler {
 public:
  // Throws std::invalid_argument for an empty dataset or a zero batch.
  StepSampler(SamplerOptions options, std::uint64_t batch_per_replica);

  // Starts epoch `epoch` from its beginning.
  void set_epoch(std::uint64_t epoch);
  // Takes the place a peer (healing) or a checkpoint had: `committed` samples of `epoch` done.
  void restore(std::uint64_t epoch, std::uint64_t committed);

  // Whether no step is left in the epoch for a quorum of `world_size`.
  bool epoch_done(int world_size) const;
  // The samples replica `rank` of a quorum of `world_size` trains in the next step (throws
  // std::invalid_argument for a rank outside the quorum); fewer, or none, in a short last step.
  std::vector<std::uint64_t> step(int rank, int world_size) const;
  // How many the whole quorum trains in the next step.
  std::uint64_t step_size(int world_size) const;
  // The quorum of `world_size` committed the step: its samples are done.
  void commit(int world_size);

  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t committed() const { return committed_; }

 private:
  SamplerOptions options_;
  std::uint64_t batch_;
  std::uint64_t epoch_ = 0;
  std::uint64_t committed_ = 0;
  std::vector<std::uint64_t> order_;  // the epoch's order
};

}  // namespace ctrun::worker
