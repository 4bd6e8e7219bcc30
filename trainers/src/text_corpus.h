// The gpt trainer's text: a file the user names, or English-like prose generated from a seed
// (sentences from a small grammar), so the repo needs no dataset download and every rank
// builds the same bytes.
#pragma once

#include <cstdint>
#include <string>

namespace ctrun::trainers {

// About `bytes` bytes (>= 1) of generated prose; the same for the same seed.
std::string generate_corpus(std::size_t bytes, std::uint64_t seed);

// The whole file; throws std::runtime_error naming the file when it cannot be read.
std::string read_corpus(const std::string& path);

}  // namespace ctrun::trainers
