#include "ctrun/worker/fault_tolerance.h"

#include <ATen/ATen.h>

#include <array>
#include <future>
#include <iostream>
#include <mutex>

#include "ctrun/worker/heartbeat.h"
#include "ctrun/worker/sampler.h"
#include "worker_runtime/base/error_text.h"
#include "worker_runtime/fault_tolerance/managed_group.h"
#include "worker_runtime/fault_tolerance/replica_state.h"
#include "worker_runtime/process_groups/ctrun_store.h"
#include "worker_runtime/process_groups/make_group.h"
#include "worker_runtime/quorum/background_asker.h"
#include "worker_runtime/quorum/quorum_asker.h"
#include "worker_runtime/quorum/quorum_plan.h"
#include "worker_runtime/quorum/quorum_settle.h"
#include "worker_runtime/sharded/sharded_access.h"

namespace ctrun::worker {

using rendezvous::ErrorCode;
using rendezvous::QuorumAssignment;

namespace {

std::string ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

void log(const std::string& line) { std::cerr << "[ctrun] fault tolerance: " << line << std::endl; }

}  // namespace

std::string check_timeouts(const FaultToleranceOptions& o) {
  const std::pair<const char*, std::chrono::milliseconds> all[] = {
      {"collective", o.collective_timeout},
      {"heartbeat", o.heartbeat_timeout},
      {"join", o.join_timeout},
      {"quorum", o.quorum_timeout}};
  for (const auto& [name, value] : all) {
    if (value.count() <= 0) {
      return std::string("fault tolerance: the ") + name + " timeout must be positive, got " +
             ms(value);
    }
  }
  if (o.heartbeat_timeout < std::chrono::milliseconds(100)) {
    return "fault tolerance: the heartbeat timeout (" + ms(o.heartbeat_timeout) +
           ") must be at least 100 ms: a replica beats four times per timeout";
  }
  if (o.collective_timeout >= o.join_timeout) {
    return "fault tolerance: the collective timeout (" + ms(o.collective_timeout) +
           ") must be shorter than the join timeout (" + ms(o.join_timeout) +
           "): the quorum would leave out live replicas still waiting for a collective to fail";
  }
  if (o.join_timeout >= o.quorum_timeout) {
    return "fault tolerance: the join timeout (" + ms(o.join_timeout) +
           ") must be shorter than the quorum timeout (" + ms(o.quorum_timeout) +
           "): replicas would give up before the quorum forms without a silent member";
  }
  if (o.heartbeat_timeout >= o.quorum_timeout) {
    return "fault tolerance: the heartbeat timeout (" + ms(o.heartbeat_timeout) +
           ") must be shorter than the quorum timeout (" + ms(o.quorum_timeout) +
           "): replicas would give up before a dead member is known dead";
  }
  return "";
}

class FaultTolerance::Impl : public StepGate {
 public:
  Impl(WorkerEnv env, FaultToleranceOptions options, ReplicaState state,
       rendezvous::QuorumConfig config, ShardSlot slot, std::unique_ptr<QuorumAsker> quorum)
      : env_(std::move(env)),
        options_(options),
        state_(state),
        config_(config),
        slot_(std::move(slot)),
        group_(*this, options.backend, Span::kWorld),
        shard_group_(*this, options.backend, Span::kShard),
        replicate_group_(*this, options.backend, Span::kReplicas),
        committed_(options.committed_step),
        quorum_(std::move(quorum)),
        background_(*quorum_, options.quorum_timeout) {
    // A worker's place in its shard group is fixed for the run: the wrapper sharding over it
    // lays out its shards once.
    shard_group_.reset(slot_.index, options_.shard_group_size);
  }

  ProcessGroup& group() { return group_; }
  ProcessGroup& shard_group() { return shard_group_; }
  ProcessGroup& replicate_group() { return replicate_group_; }

  void set_state(ReplicaState state) {
    if (current_)
      throw std::logic_error("FaultTolerance: set_state() after the first begin_step()");
    state_ = state;
  }

  Step begin_step() {
    if (step_open_)
      throw std::logic_error("FaultTolerance: begin_step() twice without should_commit()");
    if (state_.module == nullptr || state_.optimizer == nullptr) {
      throw std::logic_error(
          "FaultTolerance: the replica state needs the module and the optimizer (set_state())");
    }
    if (state_.sharded != nullptr && !last_committed_) {
      // The last step was not stepped: its gradients go, and what its failed collectives left
      // in the gathered parameters.
      ShardedAccess::discard_step(*state_.sharded);
    }
    {
      std::lock_guard lock(step_mutex_);
      step_lost_ = false;
      skip_all_ = false;
      failed_spans_.fill(false);
    }
    step_open_ = true;
    if (options_.overlap_quorum && inner_ && last_committed_ && !group_broken_) {
      // Steady state: the background thread asks while the step runs; the answer is awaited by
      // the step's first collective (step_group()).
      pending_ = background_.ask(committed_);
      return plan();
    }
    try {
      settle_quorum();
    } catch (...) {
      step_open_ = false;
      throw;
    }
    if (finished_at_) {
      step_open_ = false;
      return Step{*finished_at_, 0, 1, true};
    }
    return plan();
  }

  void finish() {
    if (auto s = quorum_->finish(committed_, options_.quorum_timeout); !s) {
      log("telling the quorum that training finished: " + s.error().message);
    }
  }

  bool should_commit() {
    if (!step_open_) throw std::logic_error("FaultTolerance: should_commit() without begin_step()");
    step_open_ = false;
    bool lost = false;
    std::string fatal;
    {
      std::lock_guard lock(step_mutex_);
      resolve_answer();
      lost = step_lost_;
      fatal = fatal_;
    }
    if (!fatal.empty()) throw std::runtime_error(fatal);
    if (sharded_groups()) {
      lost = !vote(lost);
    } else if (!lost && options_.backend == Backend::kNccl) {
      // NCCL's waits return before the collectives end, and a failure shows at the group's
      // next call: a barrier waited on the host settles the step's all-reduces. Gloo's waits
      // end with the result, so a replica whose collectives all succeeded holds the quorum's
      // average. One whose peer saw a failure instead stays behind, and heals from it before
      // the next step (the next quorum's max_step): no extra collective per step is needed.
      try {
        inner_->barrier();
      } catch (const std::exception& e) {
        collective_failed(Span::kWorld, "the step's closing barrier: " + first_line(e.what()));
        lost = true;
      }
    }
    if (lost) {
      ++stats_.steps_lost;
      last_committed_ = false;
      return false;
    }
    ++committed_;
    ++stats_.steps_committed;
    if (state_.sampler != nullptr) state_.sampler->commit(group_.size());
    last_committed_ = true;
    report_step(committed_);  // a committed step is progress (--worker_timeout, --faults)
    return true;
  }

  std::int64_t committed_step() const { return committed_; }
  const QuorumAssignment& quorum() const {
    if (!current_)
      throw std::logic_error("FaultTolerance: no quorum before the first begin_step()");
    return *current_;
  }
  Stats stats() const { return stats_; }

  // StepGate, called from the step's collectives (the backward thread too).
  ProcessGroup* step_group(Span span) override {
    std::lock_guard lock(step_mutex_);
    resolve_answer();
    if (skip_all_ || failed_spans_[static_cast<std::size_t>(span)]) return nullptr;
    switch (span) {
      case Span::kShard:
        return shard_inner_.get();
      case Span::kReplicas:
        return replicate_inner_.get();
      case Span::kWorld:
        break;
    }
    return inner_.get();
  }

  void collective_failed(Span span, const std::string& why) override {
    std::lock_guard lock(step_mutex_);
    if (!step_lost_ || !group_broken_) {
      log("step " + std::to_string(committed_ + 1) + " lost: " + why);
    }
    step_lost_ = true;
    failed_spans_[static_cast<std::size_t>(span)] = true;
    group_broken_ = true;
  }

 private:
  bool sharded_groups() const { return options_.shard_group_size > 1; }

  Step plan() const {
    return Step{committed_ + 1, rank_, static_cast<int>(plan_->trainers.size())};
  }

  // Shard groups: every training worker says whether its step succeeded; all commit or none,
  // so that a group's shards stay at one step. A worker whose step is lost votes too (no), so
  // that its peers learn it at once instead of at a timeout. True: commit.
  bool vote(bool lost) {
    ProcessGroup* world = step_group(Span::kWorld);
    if (world == nullptr) return false;
    at::Tensor ballot = at::full({1}, lost ? 1 : 0, at::kLong).to(device());
    try {
      world->all_reduce_async(ballot)->wait();
      return !lost && ballot.cpu().item<std::int64_t>() == 0;
    } catch (const std::exception& e) {
      collective_failed(Span::kWorld, "the commit vote: " + first_line(e.what()));
      return false;
    }
  }

  // Asks for the quorum of the step after `committed`, connecting again (and asking for a new
  // communicator) when the daemon went away, until the quorum timeout.
  Result<QuorumAssignment> ask(std::int64_t committed, bool rebuild) {
    return quorum_->ask(committed, rebuild, options_.quorum_timeout);
  }

  std::string no_quorum(const Error& error) const {
    return "fault tolerance: no quorum for step " + std::to_string(committed_ + 1) + " within " +
           ms(options_.quorum_timeout) +
           " (this replica is on the minority side of a partition, or fewer than " +
           std::to_string(config_.min_replicas) + " replicas are live): " + error.message;
  }

  // Under step_mutex_: takes the overlapped ask's answer, if one is pending, and loses the step
  // when the quorum is not the one the step started under.
  void resolve_answer() {
    if (!pending_.valid()) return;
    auto answer = pending_.get();
    if (!answer) {
      fatal_ = no_quorum(answer.error());
      step_lost_ = true;
      skip_all_ = true;
    } else if (continues(answer.value())) {
      current_ = std::move(answer).value();
    } else {
      // Redone under the new quorum, which the next begin_step() adopts without asking again:
      // its newcomers adopted it at once and wait in it. Every member got the same answer:
      // they all skip the step's collectives.
      step_lost_ = true;
      skip_all_ = true;
      changed_ = std::move(answer).value();
    }
  }

  // The same communicator, the same workers training, and nobody to heal: the step goes on as
  // it started.
  bool continues(const QuorumAssignment& a) const {
    if (!current_ || !plan_ || a.store_prefix != current_->store_prefix) return false;
    auto next = plan_quorum(a.members, options_.shard_group_size);
    return next && next.value().lost.empty() && !next.value().heals() &&
           next.value().trainers == plan_->trainers;
  }

  // What this worker asks with: its committed step, or 0 once it sat out a quorum (its state
  // is stale then, and may come from a step its peers redid: it must heal, never be healed from).
  std::int64_t ask_step() const { return holds_state_ ? committed_ : 0; }

  // Waits for the quorum and makes it this replica's: a communicator among its members, this
  // replica healed if behind. Retried (asking for a new communicator) when building fails.
  void settle_quorum() {
    std::optional<QuorumAssignment> changed;
    {
      std::lock_guard lock(step_mutex_);
      changed.swap(changed_);
    }
    bool ask_failed = false;
    QuorumSettleHooks hooks;
    hooks.ask = [&]() -> Result<QuorumAssignment> {
      // The quorum the overlapped ask brought, which its newcomers adopted already, comes first.
      if (changed) {
        QuorumAssignment first = std::move(*changed);
        changed.reset();
        return first;
      }
      // A new communicator when this one failed, or when there is none (just started, or the
      // daemon came back); a worker that sits out has none and needs none.
      auto answer = ask(ask_step(), group_broken_ || (!inner_ && !sitting_out_));
      ask_failed = !answer;
      return answer;
    };
    hooks.adopt = [this](const QuorumAssignment& a) { return adopt(a); };
    hooks.sitting_out = [this] { return sitting_out_; };
    hooks.heartbeat = [] { heartbeat(); };
    hooks.log = [](const std::string& line) { log(line); };
    auto settled = worker::settle_quorum(hooks, options_.quorum_timeout, clock_);
    if (!settled) {
      throw std::runtime_error(ask_failed ? no_quorum(settled.error())
                                          : "fault tolerance: " + settled.error().message);
    }
    if (settled.value()) finished_at_ = *settled.value();
  }

  // Empty on success, also when this worker sits the quorum out (sitting_out_); otherwise
  // why, and the communicators are dropped. Throws std::runtime_error when the quorum cannot
  // be trained at all (replica ids that name no shard slot, a shard's state lost).
  std::string adopt(const QuorumAssignment& a) {
    auto planned = plan_quorum(a.members, options_.shard_group_size);
    if (!planned) throw std::runtime_error("fault tolerance: " + planned.error().message);
    const QuorumPlan& p = planned.value();
    if (!p.lost.empty()) throw std::runtime_error("fault tolerance: " + p.lost);
    const auto rank = p.rank_of(a.rank);
    if (!rank) {
      // This worker's group is not whole: it waits for it, holding no communicator.
      drop_communicators();
      if (!sitting_out_) {
        log("quorum " + std::to_string(a.quorum_id) + ": shard group " + slot_.group +
            " is not whole; waiting for it");
      }
      ++stats_.quorums_sat_out;
      sitting_out_ = true;
      holds_state_ = committed_ == 0;
      current_ = a;
      plan_ = p;
      std::lock_guard lock(step_mutex_);
      group_broken_ = false;
      return "";
    }
    if (p.step == 0 && committed_ > 0 && !holds_state_) {
      throw std::runtime_error(
          "fault tolerance: this worker's state at step " + std::to_string(committed_) +
          " has no whole copy left (every group lost a worker): resume from a checkpoint");
    }
    sitting_out_ = false;
    const int size = static_cast<int>(p.trainers.size());
    const int group = *rank / p.group_size;
    try {
      if (!inner_ || !current_ || current_->store_prefix != a.store_prefix) {
        drop_communicators();  // the old communicators first: their peers may be gone
        current_.reset();
        inner_ = build_group(a.store_prefix, *rank, size);
        if (sharded_groups() || state_.sharded != nullptr) {
          shard_inner_ = build_group(a.store_prefix + "shard/" + std::to_string(group) + "/",
                                     slot_.index, p.group_size);
          replicate_inner_ =
              build_group(a.store_prefix + "replicate/" + std::to_string(slot_.index) + "/", group,
                          p.replicas());
        }
        ++stats_.rebuilds;
      }
      group_.reset(*rank, size);
      replicate_group_.reset(group, p.replicas());
      heal(a, p, *rank);
      current_ = a;
      plan_ = p;
      rank_ = *rank;
      holds_state_ = true;
      std::lock_guard lock(step_mutex_);
      group_broken_ = false;
      return "";
    } catch (const std::exception& e) {
      drop_communicators();
      current_.reset();
      std::lock_guard lock(step_mutex_);
      group_broken_ = true;
      return first_line(e.what());
    }
  }

  std::unique_ptr<ProcessGroup> build_group(const std::string& prefix, int rank, int size) {
    auto store = c10::make_intrusive<CtrunStore>(*env_.store, env_.run_id, prefix,
                                                 options_.collective_timeout);
    ProcessGroupOptions group_options;
    group_options.backend = options_.backend;
    group_options.timeout = options_.collective_timeout;
    return make_group(env_, store, rank, size, group_options);
  }

  void drop_communicators() {
    replicate_inner_.reset();
    shard_inner_.reset();
    inner_.reset();
  }

  // Training workers not at the plan's step take the state of one that is (quorum_plan.h:
  // every member computes the same plan). Before anyone committed, everyone takes the first
  // group's, so that replicas that initialised differently start equal.
  void heal(const QuorumAssignment& a, const QuorumPlan& p, int rank) {
    std::string state;
    for (std::size_t i = 0; i < p.heal_from.size(); ++i) {
      if (!p.heal_from[i]) continue;
      const int to = static_cast<int>(i);
      const int from = *p.heal_from[i];
      if (from == rank) {
        if (state.empty()) state = save_replica_state(state_, committed_);
        send_replica_bytes(*inner_, state, to, device());
        ++stats_.heals_sent;
      } else if (to == rank) {
        const std::int64_t step =
            load_replica_state(state_, recv_replica_bytes(*inner_, from, device()));
        if (step != p.step) {
          throw std::runtime_error("healing: the peer sent step " + std::to_string(step) +
                                   ", the quorum trains from step " + std::to_string(p.step));
        }
        committed_ = step;
        ++stats_.heals_received;
        if (step > 0) {
          const int member = p.trainers[static_cast<std::size_t>(from)];
          log("healed from " + a.members[static_cast<std::size_t>(member)].replica_id +
              " at step " + std::to_string(step));
        }
      }
    }
  }

  at::Device device() const {
    return options_.backend == Backend::kNccl ? at::Device(at::kCUDA, env_.local_rank)
                                              : at::Device(at::kCPU);
  }

  const WorkerEnv env_;
  const FaultToleranceOptions options_;
  ReplicaState state_;
  const rendezvous::QuorumConfig config_;
  const ShardSlot slot_;
  ManagedGroup group_;
  ManagedGroup shard_group_;
  ManagedGroup replicate_group_;

  // The main thread's: the communicators and the quorum they belong to, the committed step.
  std::unique_ptr<ProcessGroup> inner_;            // the step's training workers
  std::unique_ptr<ProcessGroup> shard_inner_;      // shard groups: this worker's group
  std::unique_ptr<ProcessGroup> replicate_inner_;  // and its shard's holders in the others
  std::optional<QuorumAssignment> current_;
  std::optional<QuorumPlan> plan_;
  int rank_ = 0;              // among the training workers
  bool sitting_out_ = false;  // shard groups: this worker's group is not whole
  bool holds_state_ = true;   // false once it sat out: it asks with step 0
  std::int64_t committed_ = 0;
  bool step_open_ = false;
  bool last_committed_ = false;
  std::optional<std::int64_t> finished_at_;  // the peers finished the training at this step
  Stats stats_;

  const std::unique_ptr<QuorumAsker> quorum_;  // thread-safe: the main and background threads'
  rendezvous::SteadyClock clock_;

  std::mutex step_mutex_;  // shared with the step's collectives
  std::future<Result<QuorumAssignment>> pending_;
  bool step_lost_ = false;
  bool skip_all_ = false;  // the quorum changed under the step: every collective is skipped
  std::array<bool, kSpans> failed_spans_{};
  bool group_broken_ = false;
  std::optional<QuorumAssignment> changed_;  // the overlapped ask's answer, when it changed
  std::string fatal_;

  BackgroundAsker background_;  // last: its thread starts once everything it uses exists
};

Result<std::unique_ptr<FaultTolerance>> FaultTolerance::start(const WorkerEnv& env,
                                                              FaultToleranceOptions options,
                                                              ReplicaState state) {
  if (state.module == nullptr || (state.optimizer == nullptr && options.shard_group_size == 1)) {
    return Error{ErrorCode::kBadRequest,
                 "fault tolerance: the replica state needs the module and the optimizer"};
  }
  if (auto why = check_timeouts(options); !why.empty()) return Error{ErrorCode::kBadRequest, why};
  if (options.shard_group_size < 1 || env.local_world_size % options.shard_group_size != 0) {
    return Error{ErrorCode::kBadRequest, "fault tolerance: the shard group size " +
                                             std::to_string(options.shard_group_size) +
                                             " must be at least 1 and divide LOCAL_WORLD_SIZE (" +
                                             std::to_string(env.local_world_size) + ")"};
  }
  auto slot = shard_slot(env.replica_id, options.shard_group_size);
  if (!slot) return Error{ErrorCode::kBadRequest, "fault tolerance: " + slot.error().message};
  if (options.backend == Backend::kNccl && !nccl_available()) {
    return Error{ErrorCode::kBadRequest,
                 "fault tolerance: the nccl backend is not in this build of libctrun_worker"};
  }
  rendezvous::QuorumConfig config;
  config.min_replicas = options.min_replicas;
  config.max_replicas = options.max_replicas > 0 ? options.max_replicas : env.world_size;
  config.join_timeout = options.join_timeout;
  config.heartbeat_timeout = options.heartbeat_timeout;
  auto quorum = QuorumAsker::connect(env, config, options.quorum_timeout);
  if (!quorum) return quorum.error();
  auto impl = std::make_unique<Impl>(env, options, state, config, std::move(slot).value(),
                                     std::move(quorum).value());
  return std::unique_ptr<FaultTolerance>(new FaultTolerance(std::move(impl)));
}

FaultTolerance::FaultTolerance(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FaultTolerance::~FaultTolerance() = default;
ProcessGroup& FaultTolerance::group() { return impl_->group(); }
ProcessGroup& FaultTolerance::shard_group() { return impl_->shard_group(); }
ProcessGroup& FaultTolerance::replicate_group() { return impl_->replicate_group(); }
void FaultTolerance::set_state(ReplicaState state) { impl_->set_state(state); }
FaultTolerance::Step FaultTolerance::begin_step() { return impl_->begin_step(); }
void FaultTolerance::finish() { impl_->finish(); }
bool FaultTolerance::should_commit() { return impl_->should_commit(); }
std::int64_t FaultTolerance::committed_step() const { return impl_->committed_step(); }
const rendezvous::QuorumAssignment& FaultTolerance::quorum() const { return impl_->quorum(); }
FaultTolerance::Stats FaultTolerance::stats() const { return impl_->stats(); }

}  // namespace ctrun::worker
