#include "rendezvous_plan.h"

#include "rendezvous/etcd/etcd.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

rdzv::Result<RendezvousPlan> plan_rendezvous(
    const LaunchOptions& o, const std::function<bool(const std::string&)>& is_local_host) {
  RendezvousPlan plan;
  const bool etcd = o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2";
  if (o.standalone) {
    // A free port: two standalone jobs on one machine do not collide.
    plan.backend.endpoints = {{"127.0.0.1", 0}};
    plan.try_host = plan.must_host = true;
    return plan;
  }
  if (o.rdzv_backend == "static") {
    plan.backend.endpoints = {{o.master_addr, static_cast<std::uint16_t>(o.master_port)}};
    plan.try_host = plan.must_host = o.node_rank == 0;
    plan.requested_rank = o.node_rank;
    return plan;
  }
  if (o.rdzv_endpoint.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_endpoint is required with --rdzv_backend=" + o.rdzv_backend};
  }
  if (o.node_rank_given) plan.requested_rank = o.node_rank;
  if (etcd) {
    auto endpoints = rdzv::etcd::parse_endpoints(o.rdzv_endpoint);
    if (!endpoints) return endpoints.error();
    plan.backend.service = rdzv::BackendSpec::Service::kEtcd;
    plan.backend.endpoints = std::move(endpoints).value();
    return plan;
  }
  auto endpoint = parse_rdzv_endpoint(o.rdzv_endpoint, rdzv::kDefaultPort);
  if (!endpoint) return endpoint.error();
  plan.backend.endpoints = {endpoint.value()};
  plan.must_host = o.rdzv_conf.is_host.value_or(false);
  plan.try_host = o.rdzv_conf.is_host.value_or(is_local_host(endpoint.value().host));
  return plan;
}

}  // namespace ctrun::launcher
