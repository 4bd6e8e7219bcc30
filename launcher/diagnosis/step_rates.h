// How fast each worker of this node trains: the steps it reports (the number in its heartbeat
// file: ctrun_worker's count of the script's optimizer steps or its report_step, the C++
// runtime's report_step) with the agent's steady time of each reading, over the last `window`
// steps. A step that goes back (a restart from a checkpoint) starts the worker's history anew.
//
// In a synchronous job every rank's step takes the slowest rank's time, so the step rate alone
// names nobody: where a worker also says how long it waited for its peers in collectives, its
// own time per step is the step less that wait, and the OS's counters (CPU time, time waiting
// for a CPU, time stopped) say where that own time went. No files, no timers: tested in memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace ctrun::launcher {

class StepRates {
 public:
  using Clock = std::chrono::steady_clock;

  // A worker has a rate once it reported this many steps past its first reading (or the whole
  // window, if shorter).
  static constexpr int kMinSteps = 5;

  explicit StepRates(int window) : window_(window < 1 ? 1 : window) {}

  // A new group of `workers` workers; none has reported yet.
  void reset(int workers);
  // A new worker in `local_rank`'s place (--fault_tolerance=step): its history starts anew.
  void restart(int local_rank);
  // What the agent read for `local_rank` at `now`: its step, and the nanoseconds it has waited
  // for its peers so far where it measures them. The same step again changes nothing.
  void observe(int local_rank, std::int64_t step, Clock::time_point now,
               std::optional<std::int64_t> waited_ns = std::nullopt);
  // What the OS said of that worker at `now` (read every sample, steps or not): its CPU time and
  // its main thread's run delay so far, and whether it is stopped, which counts for the time
  // since its previous reading (sampled at uneven times, so that a periodic stop is not missed).
  void observe_process(int local_rank, std::int64_t cpu_ns, std::int64_t run_delay_ns, bool stopped,
                       Clock::time_point now);

  struct Rate {
    int local_rank = 0;
    std::int64_t step = 0;        // the last reported
    double seconds_per_step = 0;  // over `steps` steps (and the step under way, if longer)
    std::int64_t steps = 0;       // how many steps the rate spans
    // Where the worker measures its waits: the step less them (its own time) and them, over
    // whole steps (not the one under way).
    std::optional<double> own_seconds_per_step{};
    std::optional<double> wait_seconds_per_step{};
    // Where the OS was read over the whole span: the shares of its own time (or of its step,
    // without a wait measure) spent on a CPU, waiting for one, and stopped; the rest was spent
    // off the CPU outside collectives (input, a file, a sleep).
    std::optional<double> cpu_share{}, run_delay_share{}, stopped_share{};
    std::optional<double> cpu_seconds_per_step{};  // every thread's CPU time
  };
  // The workers with a rate. A step still under way that has taken longer than the window's
  // average counts as one more step of the window, as long as it has taken so far: a worker
  // stuck in a slow step is slow before it ends it.
  std::vector<Rate> rates(Clock::time_point now) const;

 private:
  struct Counters {  // the OS's, summed since the worker started
    bool known = false;
    std::int64_t cpu_ns = 0;
    std::int64_t run_delay_ns = 0;
    std::int64_t stopped_ns = 0;
    Clock::time_point at{};
  };
  struct Point {
    std::int64_t step;
    Clock::time_point at;
    std::optional<std::int64_t> waited_ns;
    Counters os;
  };
  struct Worker {
    std::deque<Point> points;
    Counters os;
  };
  int window_;
  std::vector<Worker> workers_;
};

// The kinds of a rank's own time, as the verdict names them.
inline constexpr const char* kOwnCompute = "its own compute";
inline constexpr const char* kWaitingForInput = "waiting for input";
inline constexpr const char* kStopped = "not running: stopped";
inline constexpr const char* kWaitingForCpu = "not running: waiting for a CPU";

// Where a straggler's own time goes, from its rate's shares, in a few words for the verdict
// ("its own compute", "waiting for input", "not running: stopped", "not running: waiting for a
// CPU"); "" where the OS was not read. The largest share names it, but stopped for a quarter of
// the time is named at once (a process stopped that long is not training). The verdict, which
// sees every rank, corrects "waiting for a CPU" to its own compute where the rank computes more
// than the others (judge_steps).
std::string own_time_kind(const StepRates::Rate& rate);

}  // namespace ctrun::launcher
