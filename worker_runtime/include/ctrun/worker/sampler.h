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

}  // namespace ctrun::worker
