// Where a sharded unit's tensors lie in its flat buffer and which chunk of it each rank owns:
// the arithmetic behind ZeRO and FSDP's flat parameters, kept apart from tensors so that it is
// tested in memory and shared by the sharded wrapper and its checkpoints.
//
// A unit's tensors are laid end to end, in the order given, and the buffer is padded with zeros
// to a multiple of the world size; rank r owns elements [r * shard, (r + 1) * shard).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ctrun::worker {

struct ShardLayout {
  int world = 1;
  std::vector<std::int64_t> numels;   // of each tensor
  std::vector<std::int64_t> offsets;  // of each tensor in the flat buffer
  std::int64_t total = 0;             // elements of all tensors
  std::int64_t padded = 0;            // the flat buffer: total rounded up to a multiple of world
  std::int64_t shard = 0;             // padded / world

  // A run of one tensor's elements inside one rank's shard.
  struct Piece {
    std::size_t tensor = 0;
    std::int64_t tensor_offset = 0;  // where the run starts in the tensor (flattened)
    std::int64_t shard_offset = 0;   // and in the shard
    std::int64_t length = 0;
  };
  // The pieces of rank `rank`'s shard, in order; the padding belongs to no tensor.
  std::vector<Piece> pieces(int rank) const;
};

// Throws std::invalid_argument for a world below 1 or a negative numel.
ShardLayout make_shard_layout(const std::vector<std::int64_t>& numels, int world);

// Groups tensors of `bytes` (in registration order) into units of at least `unit_bytes` each
// (the last one may be smaller), starting from the last registered: backward produces the last
// layers' gradients first, so the first unit is ready first. Each unit lists its tensors in
// registration order.
std::vector<std::vector<std::size_t>> group_into_units(const std::vector<std::size_t>& bytes,
                                                       std::size_t unit_bytes);

}  // namespace ctrun::worker
