#include "rendezvous_plan.h"

#include "rendezvous/etcd/etcd.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

rdzv::Result<rdzv::EtcdAccess> etcd_access(const std::string& endpoint,
                                           const RendezvousConf& conf) {
  auto https = rdzv::etcd::endpoints_https(endpoint);
  if (!https) return https.error();
  if (https.value() && conf.protocol == "http") {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: protocol=http, but the endpoints are https:// ones"};
  }
  rdzv::EtcdAccess access;
  if (https.value() || conf.protocol == "https") {
    access.tls = rdzv::TlsClientFiles{conf.cacert, conf.cert, conf.key};
    if (conf.cert.empty() != conf.key.empty()) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         "--rdzv_conf: a client certificate needs both cert and key"};
    }
  } else if (!conf.cacert.empty() || !conf.cert.empty() || !conf.key.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: cacert, cert and key are TLS settings: give https:// "
                       "endpoints or protocol=https"};
  }
  if (conf.user.empty() != conf.password_file.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: an etcd user needs both user and password_file"};
  }
  access.user = conf.user;
  access.password_file = conf.password_file;
  return access;
}

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
    auto access = etcd_access(o.rdzv_endpoint, o.rdzv_conf);
    if (!access) return access.error();
    plan.backend.service = rdzv::BackendSpec::Service::kEtcd;
    plan.backend.endpoints = std::move(endpoints).value();
    plan.backend.etcd_access = std::move(access).value();
    return plan;
  }
  const RendezvousConf& c = o.rdzv_conf;
  if (!c.protocol.empty() || !c.cacert.empty() || !c.cert.empty() || !c.key.empty() ||
      !c.user.empty() || !c.password_file.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: protocol, cacert, cert, key, user and password_file are "
                       "for --rdzv_backend=etcd (TLS to ctrund is not built yet)"};
  }
  auto endpoint = parse_rdzv_endpoint(o.rdzv_endpoint, rdzv::kDefaultPort);
  if (!endpoint) return endpoint.error();
  plan.backend.endpoints = {endpoint.value()};
  plan.must_host = o.rdzv_conf.is_host.value_or(false);
  plan.try_host = o.rdzv_conf.is_host.value_or(is_local_host(endpoint.value().host));
  return plan;
}

}  // namespace ctrun::launcher
