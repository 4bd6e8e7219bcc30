// The flat-buffer arithmetic of sharding: every element of every tensor is in exactly one
// rank's shard, at the place the layout says.
#include "worker_runtime/base/shard_layout.h"

#include "catch.h"

using ctrun::worker::group_into_units;
using ctrun::worker::make_shard_layout;

TEST_CASE("shard layout: tensors end to end, padded to a multiple of the world") {
  const auto layout = make_shard_layout({5, 3, 4}, 5);
  CHECK(layout.offsets == std::vector<std::int64_t>{0, 5, 8});
  CHECK(layout.total == 12);
  CHECK(layout.shard == 3);
  CHECK(layout.padded == 15);
  const auto alone = make_shard_layout({7}, 1);
  CHECK(alone.shard == 7);
  CHECK(alone.pieces(0).size() == 1);
  CHECK_THROWS_WITH(make_shard_layout({1}, 0), "shard layout: world 0");
}

TEST_CASE("shard layout: each element lies in exactly one rank's pieces, where they say") {
  for (int world : {1, 2, 3, 4, 7}) {
    const std::vector<std::int64_t> numels{10, 1, 0, 6, 13};
    const auto layout = make_shard_layout(numels, world);
    std::vector<std::vector<int>> seen;
    for (auto n : numels) seen.emplace_back(static_cast<std::size_t>(n), 0);
    for (int r = 0; r < world; ++r) {
      std::int64_t last_end = 0;
      for (const auto& piece : layout.pieces(r)) {
        CHECK(piece.length > 0);
        CHECK(piece.shard_offset >= last_end);  // in order, not overlapping
        last_end = piece.shard_offset + piece.length;
        CHECK(last_end <= layout.shard);
        // The shard offset is the tensor element's flat position, relative to the shard.
        CHECK(r * layout.shard + piece.shard_offset ==
              layout.offsets[piece.tensor] + piece.tensor_offset);
        for (std::int64_t i = 0; i < piece.length; ++i) {
          ++seen[piece.tensor][static_cast<std::size_t>(piece.tensor_offset + i)];
        }
      }
    }
    for (const auto& tensor : seen) {
      for (int count : tensor) CHECK(count == 1);
    }
  }
}

TEST_CASE("shard layout: units fill from the last registered tensor") {
  // 4 bytes each, units of at least 8 bytes: {3, 4}, {1, 2}, {0}.
  const auto units = group_into_units({4, 4, 4, 4, 4}, 8);
  REQUIRE(units.size() == 3);
  CHECK(units[0] == std::vector<std::size_t>{3, 4});
  CHECK(units[1] == std::vector<std::size_t>{1, 2});
  CHECK(units[2] == std::vector<std::size_t>{0});
  // One unit holds everything when the cap is never reached; a huge tensor is a unit alone.
  CHECK(group_into_units({1, 2, 3}, 1000).size() == 1);
  CHECK(group_into_units({1, 100, 1}, 50) == std::vector<std::vector<std::size_t>>{{1, 2}, {0}});
  CHECK(group_into_units({}, 8).empty());
}
