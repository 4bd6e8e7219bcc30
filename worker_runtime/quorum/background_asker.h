// A replica's background thread, one for the run (not one per step): the steady state's
// overlapped asks (the next step's quorum asked for while the step's forward pass runs, the
// answer awaited before its first collective), and between them heartbeats that keep the
// replica alive in the quorum through steps longer than the heartbeat timeout. An ask in
// flight is proof of life itself: then no beat. Torch-free.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "worker_runtime/quorum/quorum_asker.h"

namespace ctrun::worker {

class BackgroundAsker {
 public:
  // Starts the thread: asks go to `asker` with `within` each; beats every quarter of its
  // heartbeat timeout.
  BackgroundAsker(QuorumAsker& asker, std::chrono::milliseconds within);
  // Stops the thread, after an ask in flight (bounded by `within`).
  ~BackgroundAsker();
  BackgroundAsker(const BackgroundAsker&) = delete;
  BackgroundAsker& operator=(const BackgroundAsker&) = delete;

  // The quorum of the step after `committed`, asked for now on the thread. One ask at a time:
  // the caller takes the answer before the next.
  std::future<Result<rendezvous::QuorumAssignment>> ask(std::int64_t committed);

 private:
  void run();

  QuorumAsker& asker_;
  const std::chrono::milliseconds within_;
  std::mutex mutex_;  // the thread's orders
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<std::int64_t> ask_for_;  // ask for the step after this committed one
  std::promise<Result<rendezvous::QuorumAssignment>> answer_;
  std::thread thread_;  // last: started once everything it uses exists
};

}  // namespace ctrun::worker
