// How a fault-tolerant replica settles on a quorum (FaultTolerance, between steps): ask for the
// quorum, adopt it (a communicator among its members, healing if behind), and ask again when
// adopting failed, until the quorum timeout. Torch-free: the asking, adopting and beating are
// the caller's, so the loop's rules are tested in memory with a manual clock.
//
// The rules: every answer is proof of life for ctrun --worker_timeout (a survivor waiting out a
// hung peer's removal asks again and again, and is not hung itself); a replica that sits out a
// quorum (its shard group is not whole) waits for the next without the deadline running out;
// a finished training ends the loop; no answer at all is an error at once (ask() has its own
// bound); adopting that keeps failing is an error once the quorum timeout has passed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/quorum.h"

namespace ctrun::worker {

struct QuorumSettleHooks {
  // The next quorum (the caller's retries and bound inside).
  std::function<rendezvous::Result<rendezvous::QuorumAssignment>()> ask;
  // Makes the quorum this replica's: empty when adopted or sat out, else why not.
  std::function<std::string(const rendezvous::QuorumAssignment&)> adopt;
  // Whether the last adopt() sat the quorum out (the replica waits for its group).
  std::function<bool()> sitting_out;
  std::function<void()> heartbeat;
  std::function<void(const std::string&)> log;
};

// What settling ended with: the training's last step when it finished, else nothing (a quorum
// adopted). Errors: the ask's own (kTimeout, ...), or kTimeout "no working communicator within
// the quorum timeout" when adopting failed until `quorum_timeout` had passed.
rendezvous::Result<std::optional<std::int64_t>> settle_quorum(
    const QuorumSettleHooks& hooks, std::chrono::milliseconds quorum_timeout,
    const rendezvous::Clock& clock);

}  // namespace ctrun::worker
