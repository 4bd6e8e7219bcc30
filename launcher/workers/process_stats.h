// What the OS says of a running worker, for the kind of a straggler's own time
// (docs/cluster.md, "Stragglers"): the CPU time of all its threads, the time its main thread
// was runnable but waited for a CPU, and whether it is stopped (SIGSTOP, a tracer). Read from
// /proc; the parser is apart from the read and tested on text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ctrun::launcher {

struct ProcessStats {
  std::int64_t cpu_ns = 0;        // user + system time, every thread
  std::int64_t run_delay_ns = 0;  // the main thread's time waiting on a run queue
  bool stopped = false;           // state T (stopped) or t (stopped by a tracer)
};

// `stat` is /proc/PID/stat's text, `schedstat` /proc/PID/schedstat's ("" where the kernel has
// none: no run delay); `ticks_per_second` the clock ticks stat counts in. Nothing when `stat`
// is not a process's.
std::optional<ProcessStats> parse_process_stats(const std::string& stat,
                                                const std::string& schedstat,
                                                long ticks_per_second);

// The process `pid`'s stats now; nothing when it is gone.
std::optional<ProcessStats> read_process_stats(int pid);

}  // namespace ctrun::launcher
