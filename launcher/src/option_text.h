// Reading option values, shared by the command line (options.cc) and the Slurm mapping
// (slurm.cc), so that both refuse the same text with the same kind of error.
#pragma once

#include <charconv>
#include <optional>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

// The most workers one agent starts (--nproc_per_node, or a GPU count from Slurm).
inline constexpr int kMaxWorkersPerNode = 4096;

inline rendezvous::Error bad(const std::string& message) {
  return rendezvous::Error{rendezvous::ErrorCode::kBadRequest, message};
}

// A whole decimal integer, or nothing (empty text, a sign alone, trailing bytes, overflow).
inline std::optional<long long> to_int(const std::string& s) {
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace ctrun::launcher
