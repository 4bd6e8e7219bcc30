// The per-step quorum of one fault-tolerant job (ctrun --fault_tolerance=step): which replicas
// train the next step together. Every replica asks once per step, with the last step it
// committed; the quorum forms when every live member of the previous quorum has asked (the
// steady state: one round trip, as fast as the slowest replica), or, when one is missing, once
// the join timeout has passed since the first ask. Newcomers are taken in at the next
// formation. The quorum's id changes only when its membership does, so that replicas rebuild
// their communicator only then.
//
// A quorum needs at least min_replicas members and a strict majority of the previous quorum:
// the side of a partition that holds a minority of the replicas gets no quorum and stops, even
// when it is the side that reaches the service, instead of training on alone and diverging.
//
// A plain class: no sockets, time only through the injected Clock, every answer returned as a
// QuorumNotice for the caller to deliver.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/quorum.h"

namespace ctrun::rendezvous {

struct QuorumNotice {
  std::string replica_id;
  QuorumAssignment assignment;
};

class Quorum {
 public:
  // `store_root`: the quorums' store prefixes are store_root + "<quorum id>/"; a service that
  // may restart without the quorum (ctrund) gives each Quorum a root of its own, so that a new
  // quorum 1 never meets in an old one's keys.
  Quorum(QuorumConfig config, const Clock& clock, std::string store_root = "quorum/");

  // A replica asks to train its next step. Answered (maybe at once) by a notice when the quorum
  // forms. A second ask of one replica before the formation replaces its first. `rebuild`: the
  // replica's communicator failed, so the quorum this ask forms gets a new id whatever its
  // membership.
  std::vector<QuorumNotice> ask(const QuorumMember& member, bool rebuild = false);
  // The replica finished the training at member.step and leaves. From then on every ask is
  // answered at once that the training finished (a replica replaced after its peers finished
  // has nothing left to train), the waiting ones included, and the finishing one itself.
  std::vector<QuorumNotice> finish(const QuorumMember& member);
  std::optional<std::int64_t> finished_step() const { return finished_step_; }
  // Proof of life between asks (a long step).
  void heartbeat(const std::string& replica_id);
  // The replica is gone (its connection closed, its worker died, it left): not waited for.
  std::vector<QuorumNotice> remove(const std::string& replica_id);
  // Applies deadlines: dead replicas, the join timeout.
  std::vector<QuorumNotice> tick();
  // When tick() next has something to do; nullopt when nothing waits.
  std::optional<TimePoint> next_deadline() const;

  const QuorumConfig& config() const { return config_; }
  std::int64_t quorum_id() const { return quorum_id_; }
  // The last quorum's members, by replica_id.
  const std::vector<QuorumMember>& members() const { return members_; }
  // Replicas that asked and wait for the next formation.
  std::vector<std::string> waiting() const;
  // Why the waiting replicas get no quorum yet, in words (for status and logs); empty when
  // nothing waits.
  std::string why_waiting() const;
  Json describe() const;

  // How many quorums formed so far (each formation counts, an unchanged id too): a replica that
  // asked at `formations() == n` and sees more got its answer in the state (the etcd quorum).
  std::int64_t formations() const { return formations_; }
  // What `replica_id` was told at the last formation; nullopt when it is not a member.
  std::optional<QuorumAssignment> assignment(const std::string& replica_id) const;
  // The replicas this quorum knows alive (asked or beat since they were last removed): where
  // liveness is kept elsewhere (etcd leases), the caller removes those it knows gone.
  std::vector<std::string> known() const;

  // The state as JSON, for replicas that run one Quorum on a shared key (the etcd quorum). The
  // join timeout runs on by wall clock across a save and a restore; every known replica is
  // restored as heard from just now (its liveness is the caller's: remove() the gone ones).
  Json save() const;
  static Result<std::unique_ptr<Quorum>> restore(const Json& saved, const Clock& clock);

 private:
  bool alive(const std::string& replica_id) const;
  // Forms the quorum if the rule allows it now.
  std::vector<QuorumNotice> maybe_form();
  // How many members of the last quorum have asked; whether that is a strict majority of it
  // (always, before the first quorum).
  std::size_t members_asking() const;
  bool has_majority() const;
  std::vector<QuorumNotice> form();
  QuorumNotice finished_notice(const QuorumMember& member) const;

  QuorumConfig config_;
  const Clock& clock_;
  std::string store_root_;
  std::int64_t quorum_id_ = 0;  // 0: none formed yet
  std::int64_t formations_ = 0;
  bool rebuild_ = false;  // an ask since the last formation asked for a new id
  std::optional<std::int64_t> finished_step_;
  std::vector<QuorumMember> members_;
  std::map<std::string, QuorumMember> asks_;     // waiting for the next formation
  std::map<std::string, TimePoint> last_heard_;  // every replica seen, until removed
  std::set<std::string> removed_;                // removed since the last formation
  std::optional<TimePoint> first_ask_;           // of the formation being gathered
};

}  // namespace ctrun::rendezvous
