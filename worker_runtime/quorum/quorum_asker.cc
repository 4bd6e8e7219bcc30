#include "worker_runtime/quorum/quorum_asker.h"

#include <algorithm>
#include <thread>

namespace ctrun::worker {

using rendezvous::ErrorCode;
using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<QuorumAsker>> QuorumAsker::connect(
    const WorkerEnv& env, rendezvous::QuorumConfig config,
    std::chrono::milliseconds connect_timeout) {
  auto quorum = StepQuorum::connect(env, config, connect_timeout);
  if (!quorum) return quorum.error();
  return std::unique_ptr<QuorumAsker>(new QuorumAsker(env, config, std::move(quorum).value()));
}

QuorumAsker::QuorumAsker(WorkerEnv env, rendezvous::QuorumConfig config,
                         std::unique_ptr<StepQuorum> quorum)
    : env_(std::move(env)), config_(config), quorum_(std::move(quorum)) {}

Result<rendezvous::QuorumAssignment> QuorumAsker::ask(std::int64_t committed, bool rebuild,
                                                      std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  std::lock_guard lock(mutex_);
  std::string last_error = "no answer";
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return Error{ErrorCode::kTimeout, "the quorum service could not be reached: " + last_error};
    }
    if (!quorum_) {
      auto connected = StepQuorum::connect(env_, config_, left);
      if (!connected) {
        last_error = connected.error().message;
        std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(100)));
        continue;
      }
      quorum_ = std::move(connected).value();
      reconnected_ = true;
    }
    auto answer = quorum_->next(committed, "", left, rebuild || reconnected_);
    if (answer) {
      reconnected_ = false;
      return answer;
    }
    if (answer.error().code != ErrorCode::kConnection) return answer.error();
    last_error = answer.error().message;
    quorum_.reset();  // the daemon went away (or restarted): connect again, ask again
  }
}

void QuorumAsker::heartbeat_if_idle() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (lock && quorum_) (void)quorum_->heartbeat();
}

rendezvous::Status QuorumAsker::finish(std::int64_t step, std::chrono::milliseconds within) {
  std::lock_guard lock(mutex_);
  if (!quorum_) return rendezvous::ok_status();
  return quorum_->finish(step, within);
}

}  // namespace ctrun::worker
