#include "launcher/workers/process_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <vector>

namespace ctrun::launcher {

std::optional<ProcessStats> parse_process_stats(const std::string& stat,
                                                const std::string& schedstat,
                                                long ticks_per_second) {
  // "PID (COMM) STATE PPID ...": the command may hold spaces and parentheses, so the fields are
  // counted from the last ')'. utime and stime are fields 14 and 15 (from 1), 11 and 12 after
  // the state.
  const auto close = stat.rfind(')');
  if (close == std::string::npos || ticks_per_second <= 0) return std::nullopt;
  std::istringstream in(stat.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string f; fields.size() < 13 && in >> f;) fields.push_back(f);
  if (fields.size() < 13 || fields[0].size() != 1) return std::nullopt;
  char* end = nullptr;
  const long long utime = std::strtoll(fields[11].c_str(), &end, 10);
  if (*end != '\0') return std::nullopt;
  const long long stime = std::strtoll(fields[12].c_str(), &end, 10);
  if (*end != '\0') return std::nullopt;
  ProcessStats s;
  s.stopped = fields[0] == "T" || fields[0] == "t";
  s.cpu_ns = static_cast<std::int64_t>((utime + stime) * (1'000'000'000LL / ticks_per_second));
  // "CPU_NS RUN_DELAY_NS TIMESLICES"
  std::istringstream sched(schedstat);
  long long cpu = 0, delay = 0;
  if (sched >> cpu >> delay && delay >= 0) s.run_delay_ns = static_cast<std::int64_t>(delay);
  return s;
}

namespace {

std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
}

}  // namespace

std::optional<ProcessStats> read_process_stats(int pid) {
  if (pid <= 0) return std::nullopt;
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  const std::string dir = "/proc/" + std::to_string(pid);
  return parse_process_stats(read_small_file(dir + "/stat"), read_small_file(dir + "/schedstat"),
                             ticks);
}

}  // namespace ctrun::launcher
