#include "launcher/diagnosis/straggler_watch.h"

#include <algorithm>

#include "rendezvous/protocol/step_keys.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// How often the workers' step files are read: a step's time is known to this much.
constexpr std::chrono::milliseconds kSampleEvery{100};

}  // namespace

StragglerWatch::StragglerWatch(asio::any_io_executor executor, StragglerSettings settings,
                               Hooks hooks)
    : executor_(std::move(executor)),
      settings_(settings),
      hooks_(std::move(hooks)),
      rates_(settings.window) {}

void StragglerWatch::workers_started(const rdzv::RoundAssignment& round, int local_world_size,
                                     std::string host) {
  round_ = round;
  local_world_size_ = local_world_size;
  host_ = std::move(host);
  rates_.reset(local_world_size);
  published_ = false;
  running_ = true;
  asio::co_spawn(executor_, run(shared_from_this(), ++epoch_), asio::detached);
}

void StragglerWatch::worker_replaced(int local_rank) { rates_.restart(local_rank); }

void StragglerWatch::workers_stopped() {
  running_ = false;
  ++epoch_;
}

rdzv::Task<void> StragglerWatch::run([[maybe_unused]] std::shared_ptr<StragglerWatch> self,
                                     int epoch) {
  asio::steady_timer timer(executor_);
  auto next_publication = std::chrono::steady_clock::now() + settings_.interval;
  while (running_ && epoch == epoch_) {
    timer.expires_after(kSampleEvery);
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (!running_ || epoch != epoch_) co_return;
    const auto now = std::chrono::steady_clock::now();
    for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
      if (!hooks_.running(local_rank)) {
        rates_.restart(local_rank);  // ended: its time must not run on
      } else if (auto step = hooks_.step(local_rank)) {
        rates_.observe(local_rank, *step, now);
      }
    }
    if (now < next_publication) continue;
    next_publication = now + settings_.interval;
    co_await publish_and_judge(epoch);
  }
}

rdzv::Task<void> StragglerWatch::publish_and_judge(int epoch) {
  const rdzv::RoundAssignment round = round_;
  std::vector<RankRate> mine;
  for (const auto& r : rates_.rates(std::chrono::steady_clock::now())) {
    mine.push_back(RankRate{round.rank_offset + r.local_rank, round.group_rank, host_, r.step,
                            r.seconds_per_step, r.steps});
  }
  // A node whose workers report no steps publishes nothing, and is judged on nothing; one whose
  // workers stopped reporting (they ended) says so once, so that node 0 does not judge the job
  // on the rates they last had.
  const std::string prefix = round.store_prefix + rdzv::kStepRatesPrefix;
  if (!mine.empty() || published_) {
    published_ = !mine.empty();
    (void)co_await hooks_.set(prefix + std::to_string(round.group_rank),
                              node_rates_json(round.group_rank, host_, mine).dump());
  }
  if (epoch != epoch_) co_return;
  std::optional<StepVerdict> verdict;
  if (round.group_rank == 0) {
    // Node 0 judges the job: every node's rates, as published this round.
    std::vector<RankRate> all = mine;
    for (int node = 1; node < round.group_world_size; ++node) {
      auto text = co_await hooks_.get(prefix + std::to_string(node));
      if (epoch != epoch_) co_return;
      if (!text) continue;
      auto ranks = node_rates_from_json(rdzv::Json::parse(text.value(), nullptr, false));
      if (!ranks) continue;
      all.insert(all.end(), ranks.value().begin(), ranks.value().end());
    }
    if (all.size() < 2) co_return;
    verdict = judge_steps(std::move(all), settings_.factor, round.round);
    (void)co_await hooks_.set(rdzv::kStragglersKey, step_verdict_json(*verdict).dump());
  } else {
    auto text = co_await hooks_.get(rdzv::kStragglersKey);
    if (!text) co_return;
    auto read = step_verdict_from_json(rdzv::Json::parse(text.value(), nullptr, false));
    if (!read || read.value().round != round.round) co_return;  // an earlier round's
    verdict = std::move(read).value();
  }
  if (epoch != epoch_) co_return;
  tell(*verdict);
}

void StragglerWatch::tell(const StepVerdict& verdict) {
  for (const auto& change : said_.take(verdict)) {
    hooks_.log(change.line);
    rdzv::Json fields = {{"ranks", change.ranks},
                         {"median_seconds_per_step", verdict.median},
                         {"factor", verdict.factor},
                         {"round", verdict.round},
                         {"reason", change.line}};
    if (change.node) fields["straggler_node"] = *change.node;
    if (change.straggling) {
      double slowdown = 0;
      for (int rank : change.ranks) slowdown = std::max(slowdown, verdict.slowdown(rank));
      fields["slowdown"] = slowdown;
    }
    hooks_.event(change.straggling ? "straggler" : "straggler_recovered", std::move(fields));
  }
}

}  // namespace ctrun::launcher
