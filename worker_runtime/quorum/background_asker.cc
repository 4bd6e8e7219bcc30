#include "worker_runtime/quorum/background_asker.h"

namespace ctrun::worker {

BackgroundAsker::BackgroundAsker(QuorumAsker& asker, std::chrono::milliseconds within)
    : asker_(asker), within_(within), thread_([this] { run(); }) {}

BackgroundAsker::~BackgroundAsker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::future<Result<rendezvous::QuorumAssignment>> BackgroundAsker::ask(std::int64_t committed) {
  std::promise<Result<rendezvous::QuorumAssignment>> answer;
  auto future = answer.get_future();
  {
    std::lock_guard lock(mutex_);
    ask_for_ = committed;
    answer_ = std::move(answer);
  }
  wake_.notify_all();
  return future;
}

void BackgroundAsker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, asker_.config().heartbeat_timeout / 4,
                   [this] { return stopping_ || ask_for_.has_value(); });
    if (stopping_) return;
    if (ask_for_) {
      const std::int64_t committed = *ask_for_;
      ask_for_.reset();
      auto answer = std::move(answer_);
      lock.unlock();
      try {
        answer.set_value(asker_.ask(committed, false, within_));
      } catch (...) {
        answer.set_exception(std::current_exception());
      }
      lock.lock();
      continue;
    }
    asker_.heartbeat_if_idle();
  }
}

}  // namespace ctrun::worker
