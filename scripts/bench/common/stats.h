// Order statistics for benchmark samples.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace bench {

// The q-quantile (0..1) by nearest rank; 0 for no samples. Sorts `samples` in place.
inline double quantile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples.size())));
  return samples[std::min(samples.size() - 1, rank == 0 ? 0 : rank - 1)];
}

inline double median(std::vector<double> samples) { return quantile(samples, 0.5); }

}  // namespace bench
