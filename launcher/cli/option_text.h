// Reading option values, shared by the command line (options.cc) and the Slurm mapping
// (slurm.cc), so that both refuse the same text with the same kind of error.
#pragma once

#include <algorithm>
#include <charconv>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

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

// Items split at `sep`; a last empty item is dropped ("a,b," -> {"a", "b"}), as getline does.
inline std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

// An environment variable's name as a shell takes it: letters, digits and '_', not starting
// with a digit.
inline bool valid_variable_name(const std::string& name) {
  if (name.empty() || (name.front() >= '0' && name.front() <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace ctrun::launcher
