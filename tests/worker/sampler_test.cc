#include "ctrun/worker/sampler.h"

#include <algorithm>
#include <set>

#include "catch.h"

using ctrun::worker::DistributedSampler;
using ctrun::worker::SamplerOptions;

namespace {

std::vector<std::vector<std::uint64_t>> shares(SamplerOptions o, int world, std::uint64_t epoch,
                                               std::uint64_t consumed = 0) {
  std::vector<std::vector<std::uint64_t>> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(o, r, world);
    s.set_epoch(epoch);
    s.set_consumed(consumed);
    out.push_back(s.indices());
  }
  return out;
}

}  // namespace

TEST_CASE("sampler: shares are disjoint and complete, padded to equal length") {
  for (int world : {1, 2, 3, 7}) {
    SamplerOptions o{100, true, 42, false};
    auto parts = shares(o, world, 0);
    std::multiset<std::uint64_t> seen;
    for (const auto& p : parts) {
      CHECK(p.size() == static_cast<std::size_t>((100 + world - 1) / world));
      seen.insert(p.begin(), p.end());
    }
    std::set<std::uint64_t> distinct(seen.begin(), seen.end());
    CHECK(distinct.size() == 100);  // complete
    // Padding repeats exactly total - 100 samples; without padding no sample repeats.
    CHECK(seen.size() - distinct.size() == parts[0].size() * world - 100);
    CHECK(*distinct.rbegin() == 99);
  }
}

TEST_CASE("sampler: drop_last truncates instead of padding") {
  SamplerOptions o{10, false, 0, true};
  auto parts = shares(o, 3, 0);
  for (const auto& p : parts) CHECK(p.size() == 3);
  CHECK(parts[0] == std::vector<std::uint64_t>{0, 3, 6});
  CHECK(parts[2] == std::vector<std::uint64_t>{2, 5, 8});
}

TEST_CASE("sampler: unshuffled order is torch's strided assignment") {
  SamplerOptions o{5, false, 0, false};
  auto parts = shares(o, 2, 0);
  CHECK(parts[0] == std::vector<std::uint64_t>{0, 2, 4});
  CHECK(parts[1] == std::vector<std::uint64_t>{1, 3, 0});  // padded from the start
}

TEST_CASE("sampler: reshuffled per epoch, identical for the same seed and epoch") {
  SamplerOptions o{1000, true, 7, false};
  DistributedSampler a(o, 0, 1), b(o, 0, 1);
  a.set_epoch(3);
  b.set_epoch(3);
  CHECK(a.indices() == b.indices());
  b.set_epoch(4);
  CHECK(a.indices() != b.indices());
  SamplerOptions other_seed = o;
  other_seed.seed = 8;
  DistributedSampler c(other_seed, 0, 1);
  c.set_epoch(3);
  CHECK(a.indices() != c.indices());
  // A permutation, not a sample with replacement.
  auto order = a.epoch_order();
  std::sort(order.begin(), order.end());
  for (std::uint64_t i = 0; i < order.size(); ++i) REQUIRE(order[i] == i);
}

TEST_CASE("sampler: the permutation does not depend on the world size") {
  SamplerOptions o{64, true, 1, false};
  DistributedSampler one(o, 0, 1), four(o, 2, 4);
  one.set_epoch(2);
  four.set_epoch(2);
  CHECK(one.epoch_order() == four.epoch_order());
}

TEST_CASE("sampler: resuming mid-epoch with another world size reads every sample once") {
  const std::uint64_t n = 1000;
  SamplerOptions o{n, true, 5, false};
  // A world of 4 reads 30 samples per rank, then a world of 3 takes over.
  const std::uint64_t per_rank_read = 30;
  auto before = shares(o, 4, 1);
  std::multiset<std::uint64_t> read;
  for (const auto& p : before) read.insert(p.begin(), p.begin() + per_rank_read);
  const std::uint64_t consumed = per_rank_read * 4;
  auto after = shares(o, 3, 1, consumed);
  std::multiset<std::uint64_t> rest;
  for (const auto& p : after) {
    CHECK(p.size() == (n - consumed + 2) / 3);
    rest.insert(p.begin(), p.end());
  }
  std::set<std::uint64_t> all(read.begin(), read.end());
  CHECK(all.size() == read.size());  // nothing read twice before the switch
  for (auto i : rest) all.insert(i);
  CHECK(all.size() == n);  // nothing skipped
  // Only padding repeats: (880 + 2) / 3 * 3 - 880 = 2 samples.
  CHECK(read.size() + rest.size() - n == 2);
  for (auto i : read) CHECK(rest.count(i) == 0);
}

TEST_CASE("sampler: bad arguments are errors") {
  CHECK_THROWS_AS(DistributedSampler(SamplerOptions{0, true, 0, false}, 0, 1),
                  std::invalid_argument);
  CHECK_THROWS_AS(DistributedSampler(SamplerOptions{10, true, 0, false}, 2, 2),
                  std::invalid_argument);
  DistributedSampler s(SamplerOptions{10, true, 0, false}, 0, 2);
  s.set_consumed(10);
  CHECK(s.num_samples() == 0);
  CHECK(s.indices().empty());
}

namespace {

using ctrun::worker::StepSampler;

// Trains one step with a quorum of replicas 0..world-1 (each its own sampler, as each worker
// has) and, when `commits`, commits it on each; returns what the quorum trained. A replica that
// joins the quorum behind the others heals first: it takes replica 0's place.
std::vector<std::uint64_t> train_step(std::vector<StepSampler>& replicas, int world, bool commits) {
  for (int r = 1; r < world; ++r) {
    auto& s = replicas[static_cast<std::size_t>(r)];
    if (s.committed() != replicas[0].committed()) {
      s.restore(replicas[0].epoch(), replicas[0].committed());
    }
  }
  std::vector<std::uint64_t> trained;
  for (int r = 0; r < world; ++r) {
    auto mine = replicas[static_cast<std::size_t>(r)].step(r, world);
    CHECK(mine.size() <= 4);
    trained.insert(trained.end(), mine.begin(), mine.end());
  }
  if (commits) {
    for (int r = 0; r < world; ++r) replicas[static_cast<std::size_t>(r)].commit(world);
  }
  return trained;
}

}  // namespace

TEST_CASE("step sampler: every sample of an epoch exactly once, whatever the membership does") {
  const SamplerOptions o{203, true, 7, false};
  std::vector<StepSampler> replicas(6, StepSampler(o, 4));
  for (auto& r : replicas) r.set_epoch(3);
  std::multiset<std::uint64_t> done;
  // The quorum's size step by step; a step of a failed replica does not commit and is redone.
  const int worlds[] = {4, 4, 3, 3, 5, 6, 2, 6, 6, 6, 6, 6, 6, 6, 6};
  int failed_steps = 0;
  int step = 0;
  while (!replicas[0].epoch_done(worlds[step % 15])) {
    const int world = worlds[step % 15];
    const bool commits = step % 4 != 2;  // every fourth step fails and is redone
    auto trained = train_step(replicas, world, commits);
    if (commits) {
      done.insert(trained.begin(), trained.end());
    } else {
      ++failed_steps;
    }
    ++step;
  }
  CHECK(failed_steps > 2);
  CHECK(done.size() == 203);
  CHECK(std::set<std::uint64_t>(done.begin(), done.end()).size() == 203);
  CHECK(*done.rbegin() == 202);
  // The epoch's order is DistributedSampler's, so both samplers agree on what an epoch is.
  DistributedSampler whole(o, 0, 1);
  whole.set_epoch(3);
  StepSampler fresh(o, 4);
  fresh.set_epoch(3);
  auto order = whole.epoch_order();
  CHECK(fresh.step(0, 2) == std::vector<std::uint64_t>{order[0], order[2], order[4], order[6]});
  CHECK(fresh.step(1, 2) == std::vector<std::uint64_t>{order[1], order[3], order[5], order[7]});
}

TEST_CASE("step sampler: a healed replica takes its peer's place, the short last step, drop_last") {
  const SamplerOptions o{10, false, 0, false};
  StepSampler peer(o, 2);
  peer.set_epoch(1);
  peer.commit(3);  // 6 of 10 done
  StepSampler healed(o, 2);
  healed.restore(peer.epoch(), peer.committed());
  CHECK(healed.step(1, 3) == peer.step(1, 3));
  // 4 left for a quorum of 3 taking 6: a short step of 4, shared unevenly, nothing repeated.
  CHECK(peer.step_size(3) == 4);
  CHECK(peer.step(0, 3) == std::vector<std::uint64_t>{6, 9});
  CHECK(peer.step(1, 3) == std::vector<std::uint64_t>{7});
  CHECK(peer.step(2, 3) == std::vector<std::uint64_t>{8});
  peer.commit(3);
  CHECK(peer.epoch_done(3));
  CHECK(peer.step(0, 3).empty());

  StepSampler dropping(SamplerOptions{10, false, 0, true}, 2);
  dropping.commit(3);
  CHECK(dropping.epoch_done(3));        // 4 left: less than a whole step of 6
  CHECK_FALSE(dropping.epoch_done(2));  // a quorum of 2 takes exactly 4
  CHECK_THROWS_AS(dropping.step(3, 3), std::invalid_argument);
  CHECK_THROWS_AS(StepSampler(o, 0), std::invalid_argument);
  CHECK_THROWS_AS(StepSampler(SamplerOptions{0, false, 0, false}, 1), std::invalid_argument);
}
