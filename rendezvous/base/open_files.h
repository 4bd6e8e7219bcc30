// The process's open-file limit (RLIMIT_NOFILE): the one place ctrun's programs read and raise
// it. A daemon or agent that serves a big job's store holds a descriptor for every rank, and the
// usual soft limit of 1024 stalls its accepts long before the hard limit would.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ctrun::rendezvous {

inline constexpr std::uint64_t kNoFileLimit = ~std::uint64_t{0};  // RLIM_INFINITY

struct OpenFileLimit {
  std::uint64_t soft = 0;
  std::uint64_t hard = 0;
};

// A limit as logs say it: the number, or "unlimited".
std::string open_file_limit_text(std::uint64_t limit);

// The limit in force now (soft and hard); {0, 0} if it cannot be read.
OpenFileLimit open_file_limit();

// Raises the soft limit to the hard one (a hard limit of "unlimited" counts as the kernel's
// fs.nr_open); returns the limit in force afterwards, unchanged when it could not be raised.
// The first call records the limit it found, for children that should get the user's back.
OpenFileLimit raise_open_file_limit();

// The limit the first raise_open_file_limit() found, when it changed it; nullopt otherwise.
std::optional<OpenFileLimit> open_file_limit_before_raise();

}  // namespace ctrun::rendezvous
