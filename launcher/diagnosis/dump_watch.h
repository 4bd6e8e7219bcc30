// The agent's part in hang reports (docs/faults.md, "Hang reports"): it watches the job's store
// for dump requests (dump_keys.h) and answers each with its workers' stacks, and it asks for
// one when its own watchdog finds a hung worker, then gathers every node's answer into the
// job's report (hang_report.h decides). The store, the stacks and the lines are hooks, so that
// the agent's seams stay its own.
#pragma once

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/task.h"
#include "launcher/diagnosis/hang_report.h"

namespace ctrun::launcher {

class DumpWatch : public std::enable_shared_from_this<DumpWatch> {
 public:
  struct Hooks {
    std::function<rendezvous::Task<rendezvous::Result<std::int64_t>>(std::string key,
                                                                     std::int64_t delta)>
        add;
    std::function<rendezvous::Task<rendezvous::Status>(std::string key, std::string value)> set;
    // The key's value, waiting at most `timeout` for it to be set.
    std::function<rendezvous::Task<rendezvous::Result<std::string>>(
        std::string key, std::chrono::milliseconds timeout)>
        get;
    // This node's answer, taken now: {"node", "host", "ranks", "flight"}; its group rank, -1 when
    // it is in no round.
    std::function<rendezvous::Task<rendezvous::Json>()> answer;
    std::function<int()> group_rank;
    std::function<void(const std::string& line)> log;
    // Wall-clock milliseconds: a request carries its time, so that the watchdogs of several
    // nodes that fire together join one request (the nodes' clocks agree to a second or so).
    std::function<std::int64_t()> wall_ms;
  };

  DumpWatch(boost::asio::any_io_executor executor, Hooks hooks);

  // Watches for requests from now on (not earlier ones) until stop().
  void start();
  void stop();
  // Taking this node's stacks now: a hung worker is not killed meanwhile.
  bool answering() const { return answering_; }

  struct Outcome {
    std::int64_t request = 0;
    JobStacks job;
    HangReport report;
  };
  // Asks every agent of the job for its stacks (or joins the newest request when it was made in
  // the last few seconds: watchdogs firing together make one report), then gathers the answers
  // of the round's `nodes` for at most `timeout`. An error when the store cannot be reached.
  rendezvous::Task<rendezvous::Result<Outcome>> report(std::string reason, int nodes,
                                                       std::chrono::milliseconds timeout);

 private:
  rendezvous::Task<void> run(std::shared_ptr<DumpWatch> self, int epoch);
  // Answers the queued requests one at a time: two at once would signal the same workers
  // together and read each other's stacks.
  rendezvous::Task<void> answer_queued(std::shared_ptr<DumpWatch> self);

  boost::asio::any_io_executor executor_;
  Hooks hooks_;
  int epoch_ = 0;  // stop() and a new start() end the loop of the one before
  bool running_ = false;
  std::deque<std::int64_t> queued_;  // requests not answered yet
  bool answering_ = false;
};

}  // namespace ctrun::launcher
