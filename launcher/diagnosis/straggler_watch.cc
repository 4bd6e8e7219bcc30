#include "launcher/diagnosis/straggler_watch.h"

#include <algorithm>

#include "rendezvous/protocol/step_keys.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

// How often the workers' step files (and /proc) are read: a step's time is known to this much.
// Each wait is drawn from 50-150 ms, so that a worker stopped and continued in a period (a
// straggler fault's 200 ms) is seen stopped for its share of the time, not always or never.
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
  // Every node publishes its rates, and node 0 judges, twice an interval: a verdict is on rates
  // at most half an interval old and comes half an interval after them at most, so a straggler
  // is named within about an interval of its rate crossing the line.
  const auto half = settings_.interval / 2;
  auto next_publication = std::chrono::steady_clock::now() + half;
  while (running_ && epoch == epoch_) {
    std::uniform_int_distribution<int> wait_ms(kSampleEvery.count() / 2,
                                               kSampleEvery.count() * 3 / 2);
    timer.expires_after(std::chrono::milliseconds(wait_ms(jitter_)));
    co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (!running_ || epoch != epoch_) co_return;
    const auto now = std::chrono::steady_clock::now();
    for (int local_rank = 0; local_rank < local_world_size_; ++local_rank) {
      if (!hooks_.running(local_rank)) {
        rates_.restart(local_rank);  // ended: its time must not run on
        continue;
      }
      if (hooks_.process) {
        if (auto os = hooks_.process(local_rank)) {
          rates_.observe_process(local_rank, os->cpu_ns, os->run_delay_ns, os->stopped, now);
        }
      }
      if (auto progress = hooks_.progress(local_rank)) {
        rates_.observe(local_rank, progress->step, now, progress->waited_ns);
      }
    }
    if (now < next_publication) continue;
    next_publication = now + half;
    co_await publish_and_judge(epoch);
  }
}

rdzv::Task<void> StragglerWatch::publish_and_judge(int epoch) {
  const rdzv::RoundAssignment round = round_;
  std::vector<RankRate> mine;
  for (const auto& r : rates_.rates(std::chrono::steady_clock::now())) {
    RankRate rate{round.rank_offset + r.local_rank,
                  round.group_rank,
                  host_,
                  r.step,
                  r.seconds_per_step,
                  r.steps};
    rate.own_seconds_per_step = r.own_seconds_per_step;
    rate.wait_seconds_per_step = r.wait_seconds_per_step;
    rate.kind = own_time_kind(r);
    rate.cpu_seconds_per_step = r.cpu_seconds_per_step;
    mine.push_back(std::move(rate));
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
                         {"median_own_seconds_per_step", verdict.median_pace},
                         {"factor", verdict.factor},
                         {"round", verdict.round},
                         {"reason", change.line}};
    if (change.node) fields["straggler_node"] = *change.node;
    if (change.straggling) {
      double slowdown = 0;
      double holds = 0;
      std::string kind;
      for (int rank : change.ranks) {
        slowdown = std::max(slowdown, verdict.slowdown(rank));
        if (verdict.holds(rank) >= holds) {
          holds = verdict.holds(rank);
          if (const RankRate* r = verdict.find(rank)) kind = r->kind;
        }
      }
      fields["slowdown"] = slowdown;
      fields["holds_seconds"] = holds;
      if (!kind.empty()) fields["kind"] = kind;
    }
    hooks_.event(change.straggling ? "straggler" : "straggler_recovered", std::move(fields));
  }
}

}  // namespace ctrun::launcher
