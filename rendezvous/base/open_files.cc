#include "rendezvous/base/open_files.h"

#include <sys/resource.h>

#include <fstream>

namespace ctrun::rendezvous {
namespace {

std::optional<OpenFileLimit> before_raise;

std::uint64_t to_limit(rlim_t v) { return v == RLIM_INFINITY ? kNoFileLimit : v; }

// The kernel's ceiling for one process (fs.nr_open), where the hard limit says "unlimited".
rlim_t nr_open() {
  std::ifstream in("/proc/sys/fs/nr_open");
  unsigned long long v = 0;
  return in >> v && v > 0 ? static_cast<rlim_t>(v) : rlim_t{1} << 20;
}

}  // namespace

std::string open_file_limit_text(std::uint64_t limit) {
  return limit == kNoFileLimit ? std::string("unlimited") : std::to_string(limit);
}

OpenFileLimit open_file_limit() {
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0) return {};
  return {to_limit(now.rlim_cur), to_limit(now.rlim_max)};
}

OpenFileLimit raise_open_file_limit() {
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0) return {};
  const rlim_t target = now.rlim_max == RLIM_INFINITY ? nr_open() : now.rlim_max;
  if (now.rlim_cur != RLIM_INFINITY && now.rlim_cur < target) {
    rlimit raised = now;
    raised.rlim_cur = target;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0 && !before_raise) {
      before_raise = OpenFileLimit{to_limit(now.rlim_cur), to_limit(now.rlim_max)};
    }
  }
  return open_file_limit();
}

std::optional<OpenFileLimit> open_file_limit_before_raise() { return before_raise; }

}  // namespace ctrun::rendezvous
