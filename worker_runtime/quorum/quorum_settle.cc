#include "worker_runtime/quorum/quorum_settle.h"

namespace ctrun::worker {

using rendezvous::Error;
using rendezvous::ErrorCode;

rendezvous::Result<std::optional<std::int64_t>> settle_quorum(
    const QuorumSettleHooks& hooks, std::chrono::milliseconds quorum_timeout,
    const rendezvous::Clock& clock) {
  auto deadline = clock.now() + quorum_timeout;
  for (;;) {
    auto answer = hooks.ask();
    if (!answer) return answer.error();
    // An answer is progress for ctrun --worker_timeout: this loop is bounded by the quorum
    // timeout, and a survivor waiting out a hung peer's removal is not hung itself.
    hooks.heartbeat();
    const rendezvous::QuorumAssignment& a = answer.value();
    if (a.finished) return std::optional<std::int64_t>(a.max_step);
    const std::string why = hooks.adopt(a);
    if (why.empty() && !hooks.sitting_out()) return std::optional<std::int64_t>();
    if (why.empty()) {
      // Waiting for the group to be whole is not failing: the quorums go on forming.
      deadline = clock.now() + quorum_timeout;
      continue;
    }
    hooks.log("quorum " + std::to_string(a.quorum_id) + ": " + why + "; asking again");
    if (clock.now() >= deadline) {
      return Error{ErrorCode::kTimeout, "no working communicator within the quorum timeout (" +
                                            std::to_string(quorum_timeout.count()) +
                                            " ms): " + why};
    }
  }
}

}  // namespace ctrun::worker
