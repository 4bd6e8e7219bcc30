#include "ctrun/worker/step_quorum.h"

namespace ctrun::worker {

using rendezvous::ErrorCode;

Result<std::unique_ptr<StepQuorum>> StepQuorum::connect(const WorkerEnv& env,
                                                        rendezvous::QuorumConfig config,
                                                        rendezvous::Duration connect_timeout) {
  if (!env.fault_tolerant) {
    return Error{ErrorCode::kBadRequest,
                 "the per-step quorum needs a worker started by ctrun --fault_tolerance=step "
                 "(CTRUN_FAULT_TOLERANCE=step)"};
  }
  if (!env.store) {
    return Error{ErrorCode::kBadRequest,
                 "the per-step quorum needs the job's store (CTRUN_STORE_ADDR or "
                 "CTRUN_STORE_BACKEND=etcd); this "
                 "worker was not given one"};
  }
  if (auto s = rendezvous::validate(config); !s) return s.error();
  auto client = rendezvous::connect_quorum(*env.store, env.run_id.empty() ? "default" : env.run_id,
                                           env.replica_id, connect_timeout);
  if (!client) return client.error();
  return std::unique_ptr<StepQuorum>(
      new StepQuorum(std::move(client).value(), env.replica_id, config));
}

StepQuorum::StepQuorum(std::unique_ptr<rendezvous::QuorumClient> client, std::string replica_id,
                       rendezvous::QuorumConfig config)
    : client_(std::move(client)), replica_id_(std::move(replica_id)), config_(config) {}

Result<rendezvous::QuorumAssignment> StepQuorum::next(std::int64_t committed_step,
                                                      const std::string& address,
                                                      rendezvous::Duration timeout, bool rebuild) {
  rendezvous::QuorumRequest request;
  request.member = rendezvous::QuorumMember{replica_id_, committed_step, address};
  request.config = config_;
  request.rebuild = rebuild;
  return client_->quorum(request, timeout);
}

rendezvous::Status StepQuorum::finish(std::int64_t step, rendezvous::Duration timeout) {
  rendezvous::QuorumRequest request;
  request.member = rendezvous::QuorumMember{replica_id_, step, ""};
  request.config = config_;
  request.finished = true;
  auto answer = client_->quorum(request, timeout);
  if (!answer) return answer.error();
  return rendezvous::ok_status();
}

rendezvous::Status StepQuorum::heartbeat() {
  return client_->quorum_heartbeat(replica_id_, config_.heartbeat_timeout);
}

}  // namespace ctrun::worker
