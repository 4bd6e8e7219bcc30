#include "launcher/diagnosis/dump_watch.h"

#include <cstdlib>

#include "rendezvous/protocol/dump_keys.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// A request seen this recently is joined instead of made again.
constexpr std::chrono::seconds kJoinRecentRequest{5};
// A watch's wait for the next request: bounded, so that a stop or a lost connection is noticed.
constexpr std::chrono::seconds kWatchWait{10};

}  // namespace

DumpWatch::DumpWatch(asio::any_io_executor executor, Hooks hooks)
    : executor_(std::move(executor)), hooks_(std::move(hooks)) {}

void DumpWatch::start() {
  running_ = true;
  asio::co_spawn(executor_, run(shared_from_this(), ++epoch_), asio::detached);
}

void DumpWatch::stop() {
  running_ = false;
  ++epoch_;
}

rdzv::Task<void> DumpWatch::run(std::shared_ptr<DumpWatch> self, int epoch) {
  asio::steady_timer timer(executor_);
  std::int64_t next = 0;  // only requests from now on: a later agent does not answer old ones
  while (running_ && epoch == epoch_) {
    if (next == 0) {
      // Read, not added to: a job nobody asks a report of keeps no key of it.
      auto count = co_await hooks_.get(rdzv::kDumpRequestsKey, std::chrono::milliseconds(0));
      if (count) {
        next = std::strtoll(count.value().c_str(), nullptr, 10) + 1;
        continue;
      }
      if (count.error().code == rdzv::ErrorCode::kNotFound ||
          count.error().code == rdzv::ErrorCode::kTimeout) {
        next = 1;
        continue;
      }
    } else {
      auto text = co_await hooks_.get(rdzv::dump_request_key(next), kWatchWait);
      if (!running_ || epoch != epoch_) co_return;
      if (text) {
        queued_.push_back(next++);
        if (!answering_) asio::co_spawn(executor_, answer_queued(self), asio::detached);
        continue;
      }
      if (text.error().code == rdzv::ErrorCode::kTimeout) continue;
    }
    timer.expires_after(std::chrono::seconds(1));  // not connected now (a reconnect under way)
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

rdzv::Task<void> DumpWatch::answer_queued([[maybe_unused]] std::shared_ptr<DumpWatch> self) {
  answering_ = true;
  while (!queued_.empty()) {
    const std::int64_t request = queued_.front();
    queued_.pop_front();
    const int node = hooks_.group_rank();
    if (node < 0) continue;  // in no round: no ranks to answer for
    rdzv::Json mine = co_await hooks_.answer();
    auto s = co_await hooks_.set(rdzv::dump_answer_key(request, node), mine.dump());
    if (!s) {
      hooks_.log("warning: hang report " + std::to_string(request) +
                 ": this node's stacks did not reach the job's store: " + s.error().message);
    }
  }
  answering_ = false;
}

rdzv::Task<rdzv::Result<DumpWatch::Outcome>> DumpWatch::report(std::string reason, int nodes,
                                                               std::chrono::milliseconds timeout) {
  Outcome outcome;
  const auto now = std::chrono::steady_clock::now();
  const std::int64_t wall = hooks_.wall_ms();
  // The newest request, if it is recent: joined.
  if (auto count = co_await hooks_.get(rdzv::kDumpRequestsKey, std::chrono::milliseconds(0))) {
    const std::int64_t newest = std::strtoll(count.value().c_str(), nullptr, 10);
    auto text = co_await hooks_.get(rdzv::dump_request_key(newest), std::chrono::milliseconds(0));
    const std::int64_t at = text ? rdzv::dump_request_at(text.value()) : 0;
    if (newest > 0 && at > 0 && std::llabs(wall - at) < kJoinRecentRequest.count() * 1000) {
      outcome.request = newest;
    }
  }
  if (outcome.request == 0) {
    auto number = co_await hooks_.add(rdzv::kDumpRequestsKey, 1);
    if (!number) co_return number.error();
    outcome.request = number.value();
    const std::string request =
        rdzv::encode_dump_request({reason, "node " + std::to_string(hooks_.group_rank()), wall});
    if (auto s = co_await hooks_.set(rdzv::dump_request_key(outcome.request), request); !s) {
      co_return s.error();
    }
  }
  // Every node's answer, each waited for within what is left of the time.
  const auto deadline = now + timeout;
  DumpAnswers answers(nodes, /*nodes_from_node0=*/false);
  for (int node = 0; node < nodes; ++node) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto text = co_await hooks_.get(rdzv::dump_answer_key(outcome.request, node),
                                    std::max(left, std::chrono::milliseconds(1)));
    if (text) answers.add(node, text.value());
  }
  outcome.job = answers.job();
  outcome.report =
      build_hang_report(outcome.job.ranks, outcome.job.missing_nodes, outcome.job.flight);
  co_return outcome;
}

}  // namespace ctrun::launcher
