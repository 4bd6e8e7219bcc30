#include "worker_runtime/base/shard_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ctrun::worker {

ShardLayout make_shard_layout(const std::vector<std::int64_t>& numels, int world) {
  if (world < 1) throw std::invalid_argument("shard layout: world " + std::to_string(world));
  ShardLayout layout;
  layout.world = world;
  layout.numels = numels;
  for (std::int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("shard layout: negative numel " + std::to_string(n));
    layout.offsets.push_back(layout.total);
    layout.total += n;
  }
  layout.shard = (layout.total + world - 1) / world;
  layout.padded = layout.shard * world;
  return layout;
}

std::vector<ShardLayout::Piece> ShardLayout::pieces(int rank) const {
  std::vector<Piece> out;
  const std::int64_t begin = rank * shard;
  const std::int64_t end = begin + shard;
  for (std::size_t t = 0; t < numels.size(); ++t) {
    const std::int64_t from = std::max(begin, offsets[t]);
    const std::int64_t to = std::min(end, offsets[t] + numels[t]);
    if (from >= to) continue;
    out.push_back({t, from - offsets[t], from - begin, to - from});
  }
  return out;
}

std::vector<std::vector<std::size_t>> group_into_units(const std::vector<std::size_t>& bytes,
                                                       std::size_t unit_bytes) {
  std::vector<std::vector<std::size_t>> units;
  std::size_t filled = 0;
  for (std::size_t n = bytes.size(); n-- > 0;) {
    if (units.empty() || filled >= unit_bytes) {
      units.emplace_back();
      filled = 0;
    }
    units.back().push_back(n);
    filled += bytes[n];
  }
  for (auto& unit : units) std::reverse(unit.begin(), unit.end());
  return units;
}

}  // namespace ctrun::worker
