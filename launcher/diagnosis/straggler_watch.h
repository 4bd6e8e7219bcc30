// The agent's straggler detection while its workers run (stragglers.h decides): it samples its
// workers' reported steps, publishes their rates to the job's store every interval, and on node
// 0 judges every node's rates into the job's verdict (kStragglersKey); every agent reads that
// verdict and says what changed (a line, an event). The store and the files are hooks, so that
// the agent's seams stay its own.
#pragma once

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/round.h"
#include "ctrun/rendezvous/task.h"
#include "launcher/diagnosis/step_rates.h"
#include "launcher/diagnosis/stragglers.h"
#include "launcher/workers/heartbeat_files.h"
#include "launcher/workers/process_stats.h"

namespace ctrun::launcher {

struct StragglerSettings {
  double factor = 2.0;  // a rank whose own time a step is this many times the job's is a straggler
  int window = 50;      // steps a rate spans
  std::chrono::milliseconds interval{5000};  // rates and verdicts twice an interval
};

class StragglerWatch : public std::enable_shared_from_this<StragglerWatch> {
 public:
  struct Hooks {
    // Whether local rank `local_rank`'s worker runs, and the step it last reported with the
    // time it has waited for its peers where it measures that, if any (a file caught mid-write
    // reads as none).
    std::function<bool(int local_rank)> running;
    std::function<std::optional<HeartbeatFiles::Progress>(int local_rank)> progress;
    // What the OS says of that worker now (CPU time, run delay, stopped), if it can be read;
    // none without the hook.
    std::function<std::optional<ProcessStats>(int local_rank)> process;
    std::function<rendezvous::Task<rendezvous::Status>(std::string key, std::string value)> set;
    // The key's value now, without waiting; an error when it is not set.
    std::function<rendezvous::Task<rendezvous::Result<std::string>>(std::string key)> get;
    std::function<void(const std::string& line)> log;
    std::function<void(const std::string& name, rendezvous::Json fields)> event;
  };

  StragglerWatch(boost::asio::any_io_executor executor, StragglerSettings settings, Hooks hooks);

  // This node's workers started in `round`; `host` names this node in the lines.
  void workers_started(const rendezvous::RoundAssignment& round, int local_world_size,
                       std::string host);
  // --fault_tolerance=step: one worker replaced, the others going on.
  void worker_replaced(int local_rank);
  // The workers stopped: nothing is sampled or published until they start again.
  void workers_stopped();

 private:
  rendezvous::Task<void> run(std::shared_ptr<StragglerWatch> self, int epoch);
  rendezvous::Task<void> publish_and_judge(int epoch);
  void tell(const StepVerdict& verdict);

  boost::asio::any_io_executor executor_;
  StragglerSettings settings_;
  Hooks hooks_;
  StepRates rates_;
  StragglerLog said_;
  rendezvous::RoundAssignment round_;
  int local_world_size_ = 0;
  std::string host_;
  std::mt19937 jitter_{std::random_device{}()};  // the samples' uneven times
  int epoch_ = 0;           // a new start or a stop ends the loop of the one before
  bool published_ = false;  // this round's last publication named ranks
  bool running_ = false;
};

}  // namespace ctrun::launcher
