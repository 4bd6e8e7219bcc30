#include "ctrun/worker/sampler.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

namespace ctrun::worker {
namespace {

// A uniform draw in [0, bound) by rejection, so the permutation is the same with every standard
// library (std::uniform_int_distribution and std::shuffle are implementation-defined).
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % bound;
}

}  // namespace

DistributedSampler::DistributedSampler(SamplerOptions options, int rank, int world_size)
    : options_(options), rank_(rank), world_size_(world_size) {
  if (options_.dataset_size == 0) throw std::invalid_argument("sampler: the dataset is empty");
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw std::invalid_argument("sampler: rank " + std::to_string(rank) +
                                " is outside a world of " + std::to_string(world_size));
  }
}

void DistributedSampler::set_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  consumed_ = 0;
}

void DistributedSampler::set_consumed(std::uint64_t consumed) { consumed_ = consumed; }

std::vector<std::uint64_t> DistributedSampler::epoch_order() const {
  std::vector<std::uint64_t> order(options_.dataset_size);
  for (std::uint64_t i = 0; i < order.size(); ++i) order[i] = i;
  if (options_.shuffle) {
    // One stream per (seed, epoch); mt19937_64's output is fixed by the standard.
    std::seed_seq seq{static_cast<std::uint32_t>(options_.seed),
                      static_cast<std::uint32_t>(options_.seed >> 32),
                      static_cast<std::uint32_t>(epoch_), static_cast<std::uint32_t>(epoch_ >> 32)};
    std::mt19937_64 rng(seq);
    for (std::uint64_t i = order.size() - 1; i > 0; --i) {
      std::swap(order[i], order[uniform_below(rng, i + 1)]);
    }
  }
  return order;
}

std::uint64_t DistributedSampler::num_samples() const {
  const std::uint64_t n = options_.dataset_size;
  const std::uint64_t left = consumed_ >= n ? 0 : n - consumed_;
  const auto w = static_cast<std::uint64_t>(world_size_);
  return options_.drop_last ? left / w : (left + w - 1) / w;
}

std::vector<std::uint64_t> DistributedSampler::indices() const {
  const std::uint64_t per_rank = num_samples();
  std::vector<std::uint64_t> out;
  if (per_rank == 0) return out;
  const std::vector<std::uint64_t> order = epoch_order();
  const std::uint64_t n = order.size();
  const std::uint64_t left = n - consumed_;
  out.reserve(per_rank);
  for (std::uint64_t k = 0; k < per_rank; ++k) {
    // Padding wraps around to the start of the remaining samples, as torch pads from the start.
    const std::uint64_t pos = (k * static_cast<std::uint64_t>(world_size_) + rank_) % left;
    out.push_back(order[consumed_ + pos]);
  }
  return out;
}

StepSampler::StepSampler(SamplerOptions options, std::uint64_t batch_per_replica)
    : options_(options), batch_(batch_per_replica) {
  if (batch_ == 0) throw std::invalid_argument("step sampler: the batch per replica is 0");
  set_epoch(0);  // an empty dataset throws here, as DistributedSampler's constructor does
}

void StepSampler::set_epoch(std::uint64_t epoch) { restore(epoch, 0); }

void StepSampler::restore(std::uint64_t epoch, std::uint64_t committed) {
  if (order_.empty() || epoch != epoch_) {
    DistributedSampler whole(options_, 0, 1);
    whole.set_epoch(epoch);
    order_ = whole.epoch_order();
  }
  epoch_ = epoch;
  committed_ = std::min<std::uint64_t>(committed, order_.size());
}

std::uint64_t StepSampler::step_size(int world_size) const {
  if (world_size < 1) throw std::invalid_argument("step sampler: a quorum of no replicas");
  const std::uint64_t whole = batch_ * static_cast<std::uint64_t>(world_size);
  const std::uint64_t left = order_.size() - committed_;
  if (left >= whole) return whole;
  return options_.drop_last ? 0 : left;
}

bool StepSampler::epoch_done(int world_size) const { return step_size(world_size) == 0; }

std::vector<std::uint64_t> StepSampler::step(int rank, int world_size) const {
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("step sampler: rank " + std::to_string(rank) +
                                " is outside a quorum of " + std::to_string(world_size));
  }
  const std::uint64_t size = step_size(world_size);
  std::vector<std::uint64_t> out;
  for (std::uint64_t k = static_cast<std::uint64_t>(rank); k < size;
       k += static_cast<std::uint64_t>(world_size)) {
    out.push_back(order_[committed_ + k]);
  }
  return out;
}

void StepSampler::commit(int world_size) { committed_ += step_size(world_size); }

}  // namespace ctrun::worker
