// --faults on one node, carried out: the plan read at setup; while workers run, what falls due
// (fault_injector.h decides) done with signals, files, nft rules, disk fills, a cut-off from the
// rendezvous and the hosted rendezvous's stop and start; faults asked for by `ctrun fault` read
// from the job's store; what each injected fault was recorded there; and the report at the end
// (fault_report.h, fault_timeline.h). The agent tells it the workers' lifecycle and lends it the
// workers, the rendezvous and the steps the workers report; everything runs on the agent's loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctrun/launcher/options.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/round.h"
#include "ctrun/rendezvous/task.h"
#include "launcher/faults/cut_off_backend.h"
#include "launcher/faults/fault_injector.h"
#include "launcher/faults/fault_report.h"
#include "launcher/faults/fault_timeline.h"
#include "launcher/faults/node_faults.h"
#include "launcher/workers/worker_runner.h"
#include "rendezvous/backend/backend.h"

namespace ctrun::launcher {

class FaultRunner {
 public:
  struct Hooks {
    std::function<void(const std::string& line)> log;
    std::function<void(const std::string& name, rendezvous::Json fields)> event;
    // The step local rank `local_rank`'s running worker last reported, if any.
    std::function<std::optional<std::int64_t>(int local_rank)> step;
    // Where that worker keeps its files (a planned exception is written there for it).
    std::function<std::string(int local_rank)> worker_dir;
    // The rendezvous this agent hosts, stopped as a killed daemon (false: it hosts none), and
    // started again.
    std::function<bool()> stop_rendezvous;
    std::function<rendezvous::Status()> start_rendezvous;
    // The agent is exiting: nothing more is started.
    std::function<bool()> exiting;
  };

  // --faults (a JSON file, an inline plan, random:..., or "live" for `ctrun fault` alone) read
  // and checked against what this node can do: an error naming the fault that cannot run here.
  // Empty with --fault_report alone: no faults, a clean run's report to compare with.
  static rendezvous::Result<std::unique_ptr<FaultRunner>> create(boost::asio::io_context& io,
                                                                 const LaunchOptions& options,
                                                                 std::string node_id,
                                                                 WorkerRunner& workers,
                                                                 Hooks hooks);

  // The agent's rendezvous behind the switch of a planned (or asked for) cut-off; the runner
  // then records its faults through it. Called once, before anything else runs.
  std::unique_ptr<rendezvous::Backend> wrap_backend(std::unique_ptr<rendezvous::Backend> inner);
  // Connected to the rendezvous as `host`: with --faults, those asked for by `ctrun fault` are
  // watched from now on (once; it outlives reconnects).
  void connected(const std::string& host);

  // The workers' lifecycle, as the agent sees it.
  void workers_started(const rendezvous::RoundAssignment& round, int local_world_size,
                       int restart_count, bool hosts_rendezvous);
  void worker_replaced(int local_rank, int restart_count);  // --fault_tolerance=step
  void worker_ended(const WorkerExit& exit);
  // The group is being stopped: workers a planned hang holds stopped are continued, so that they
  // see the signal as a real hung worker would.
  void workers_stopping();
  // --fault_report: the file local rank `local_rank`'s worker writes its result to.
  void set_result_file(int local_rank, std::string path);

  // At the agent's end: nothing of the node's faults outlives it; each injected fault's line,
  // and --fault_report's file.
  void finish(int exit_code, int rank_offset);

 private:
  FaultRunner(boost::asio::io_context& io, const LaunchOptions& options, std::string node_id,
              FaultPlan plan, WorkerRunner& workers, Hooks hooks);
  // What a fault needs that this node may lack (root and nft for a lost link, a GPU for a CUDA
  // error, a hosted rendezvous to restart): an error naming the fault, else ok.
  rendezvous::Status check_needs(const Fault& fault) const;
  void arm_timer();
  void tick();
  void carry_out(const FaultInjector::Action& action, const FaultInjector::Due& due);
  // A link fault: the peer's address read from the round's store, then cut.
  rendezvous::Task<void> cut_link(int fault_id, int peer);
  // What an injected fault was, in the job's store (kFaultsInjectedKey): `ctrun status`, the
  // daemon's metrics and `ctrun fault` read it there, apart from real failures. `then` runs
  // once it is written (or failed to be).
  void record(const FaultInjector::Fired& fired, int pid, std::function<void()> then);
  // `ctrun fault`: the faults asked for while the job runs, read from the job's store in turn.
  rendezvous::Task<void> watch_requests();
  void take_request(std::int64_t number, const std::string& text);
  void log(const std::string& line) const { hooks_.log(line); }

  boost::asio::io_context& io_;
  const LaunchOptions& options_;
  std::string node_id_;
  std::string host_;  // this node's address, once connected
  WorkerRunner& workers_;
  Hooks hooks_;
  FaultInjector injector_;
  FaultReport report_;                // what became of the faults injected here
  FaultTimeline timeline_;            // the same as a picture (--fault_report=FILE.html)
  CutOffBackend* backend_ = nullptr;  // the agent's rendezvous, owned by the agent
  rendezvous::RoundAssignment round_;
  int local_world_size_ = 0;
  std::vector<std::optional<std::int64_t>> steps_;  // by local rank: the last step seen
  std::vector<std::string> result_files_;           // by local rank (--fault_report)
  boost::asio::steady_timer timer_;
  // The node's cut links and full disks.
  NodeFaults node_faults_;
  bool rendezvous_down_ = false;  // the hosted rendezvous stopped by a fault, to start again
  bool watching_requests_ = false;
};

}  // namespace ctrun::launcher
